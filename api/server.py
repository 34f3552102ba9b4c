"""Run the API under uvicorn with a drain: SIGTERM -> new jobs get 503, open streams go on.

uvicorn alone stops listening at the first SIGTERM. Here the first SIGTERM only marks the
app draining (POST /v1/jobs answers 503 with Retry-After, so a load balancer's retry goes
to another replica) and waits until no SSE stream is open, at most `api_drain_s`; then
uvicorn shuts down and cuts what is left (clients resume elsewhere with Last-Event-ID).
A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from tokenq.api import sse
from tokenq.api.app import app_from_env
from tokenq.api.deps import AppState
from tokenq.api.header_limits import limited
from tokenq.shared import logs
from tokenq.shared.settings import LOOPBACK_HOSTS

log = logging.getLogger("tokenq.api")

TICK_S = 1.0  # the server's own loop: the Date header's refresh and the exit check


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_s: float):
        super().__init__(config)
        self.app = app
        self.drain_s = drain_s
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()

    async def main_loop(self) -> None:
        """uvicorn's own loop wakes ten times a second to refresh the Date header and look
        for an exit. Here it wakes once a second (the header keeps its one-second
        resolution) and at once when told to exit: on an idle replica those ten wake-ups
        were most of its wake-ups (docs/benchmarks.md, "The API's timers")."""
        self._loop = asyncio.get_running_loop()
        while not await self.on_tick(0):  # 0: every tick refreshes the header
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), TICK_S)

    def _exit_now(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # (a loop closing meanwhile)
                loop.call_soon_threadsafe(self._exit.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state: AppState | None = getattr(self.app.state, "tokenq", None)
        if self.draining or state is None:
            self._exit_now(sig, frame)
            return
        self.draining = state.draining = True
        log.warning("draining: new jobs get 503; waiting up to %.0fs for %d open stream(s)",
                    self.drain_s, state.hub.watched)

        def finish() -> None:
            deadline = time.monotonic() + self.drain_s
            while state.hub.watched and time.monotonic() < deadline:
                time.sleep(0.1)
            self._exit_now(sig, frame)

        threading.Thread(target=finish, name="tokenq-api-drain", daemon=True).start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        sse.close_all()  # open event streams end cleanly; their clients resume elsewhere
        await super().shutdown(sockets)


def serve(host: str, port: int) -> None:
    logs.configure("INFO")
    app = app_from_env()
    settings = app.state.settings
    if not app.state.api_keys_configured:
        # Without keys anyone who can connect is the admin tenant: never off this machine
        # (in production create_app refuses to start at all).
        if host not in LOOPBACK_HOSTS:
            log.warning("no API keys configured (TOKENQ_API_KEYS / TOKENQ_API__KEYS_FILE): "
                        "binding to 127.0.0.1 instead of %s", host)
            host = "127.0.0.1"
        log.warning("no API keys configured: listening on loopback only (%s:%d)", host, port)
    # RawSend outermost: event streams send their events past the middlewares (api/sse.py).
    # The protocol bounds each request's header section in size and time (api/header_limits.py).
    config = uvicorn.Config(sse.RawSend(app), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=2,
                            http=limited(settings.api.max_header_bytes,
                                         settings.api.header_timeout_s))
    DrainingServer(config, app, settings.api.drain_s).run()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="the tokenq API with drain on SIGTERM")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    serve(args.host, args.port)
