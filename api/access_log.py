"""Access log: one line per request (method, path, status, duration, tenant) on the
`tokenq.access` logger, written when the response ends (an SSE stream: when it closes).
Off with TOKENQ_API__ACCESS_LOG=false."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("tokenq.access")


class AccessLog:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            principal = scope.get("state", {}).get("principal")
            ms = round((time.perf_counter() - t0) * 1000, 1)
            log.info("%s %s %d %.1fms", scope["method"], scope["path"], status or 500, ms,
                     extra={"method": scope["method"], "path": scope["path"],
                            "status": status or 500, "duration_ms": ms,
                            "tenant": principal.tenant if principal else None})
