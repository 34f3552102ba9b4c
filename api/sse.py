"""Server-Sent Events out of the API: the event format and the streaming response.

Why not a general SSE library's response: the per-event path is the API tier's cost per
token (docs/benchmarks.md, "The queue itself"). A library response puts a cancel scope
(its send timeout) and the async-library lookup around every event; here an event is one
`send` and nothing else, and the rest is done per stream, not per event:
- keep-alive: a `: ping` comment after `ping_s` with nothing sent (proxies drop quiet
  connections);
- the send timeout: a client that takes no bytes for `send_timeout_s` is dropped (checked
  every `ping_s` or `send_timeout_s / 2`, whichever is shorter; 0 turns it off);
- a client that disconnects ends the stream at once (its events' generator is closed, so
  its cleanup runs: the hub lets the stream go, `cancel_on_disconnect` cancels);
- at shutdown every open stream ends cleanly (`close_all`), so clients reconnect with
  Last-Event-ID.
Each of those is one helper task per stream that wakes at those intervals, never per event.
Those wake-ups fall on a shared one-second grid (`on_grid`): a thousand open streams wake
the process once a second together, not sixty-odd times a second each on its own phase.

Body chunks skip the middlewares' send wrappers: `RawSend`, the outermost layer
(api/server.py), puts the server's own `send` in the scope, and a stream sends its
response start through the middlewares (the access log sees the status) and its events
straight to the server. Each wrapper is a coroutine call per event, together about a
seventh of the API's time per token; none of them looks at a body (none may: an event
stream must not be buffered or compressed).

Several events may go in one chunk: a body iterator may yield the bytes of many (`event`
concatenated), e.g. what piled up while the client was slow. A client sees the same
events, ids and text either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import AsyncIterator, Mapping

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenq.shared import aio

SEP = "\r\n"
_LINES = re.compile(r"\r\n|\r|\n")
PING = b": ping\r\n\r\n"
RAW_SEND = "tokenq.raw_send"  # the scope key RawSend sets
_open: set[EventStream] = set()
GRID_S = 1.0  # per-stream timers are rounded up to this grid of the loop's clock


def on_grid(t: float, every: float) -> float:
    """`t` (the loop's clock) rounded up to the next GRID_S (or `every`, when a timer is
    set shorter): timers of many streams that are due within the same second fire in one
    wake-up of the process (200 waiting streams: 6 wake-ups a second, not 56-245;
    docs/benchmarks.md, "The API's timers")."""
    grid = min(GRID_S, every) if every > 0 else GRID_S
    return math.ceil(t / grid - 1e-9) * grid  # (a point itself, in float, stays put)


def next_due(due: float, now: float, every: float) -> float:
    """When a timer that fires every `every` seconds on the grid fires next, after firing
    at `due`: a period after `due` (not after `now`, which is a little past the grid point
    by the work done on waking: rounding that up would skip a grid point each time), or,
    the first time or fallen behind, the grid point a period from now."""
    if due + every > now:
        return on_grid(due + every, every)
    return on_grid(now + every, every)


def event(data: str, *, event: str | None = None, id: str | None = None) -> bytes:
    """One event's bytes. `data` may span lines (each becomes a `data:` line); an id or an
    event name has its line breaks removed (they would end the field early)."""
    head = ""
    if id is not None:
        head += "id: " + _one_line(id) + SEP
    if event is not None:
        head += "event: " + _one_line(event) + SEP
    if "\n" in data or "\r" in data:
        body = "".join(f"data: {line}{SEP}" for line in _LINES.split(data))
    else:
        body = "data: " + data + SEP
    return (head + body + SEP).encode()


def _one_line(field: str) -> str:
    return _LINES.sub("", field) if "\n" in field or "\r" in field else field


def close_all() -> None:
    """End every open stream of this process (server shutdown): each sends its last chunk."""
    for stream in list(_open):
        stream.close()


class RawSend:
    """The outermost ASGI layer: the server's `send`, in the scope for event streams."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await self.app(scope, receive, send)


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], *, ping_s: float, send_timeout_s: float,
                 headers: Mapping[str, str] | None = None,
                 background: BackgroundTask | None = None, status_code: int = 200) -> None:
        self.body_iterator = body
        self.status_code = status_code  # (a parameter: OpenAPI reads its default)
        self.background = background
        self._ping_s = ping_s
        self._send_timeout_s = send_timeout_s
        self._sent = 0  # chunks sent (events and pings)
        self._inflight = 0  # sends not returned yet (the pump's and a ping's)
        self._sending_since: float | None = None  # since when some send has been in flight
        self._pump: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[bool] | None = None
        hdrs = dict(headers or {})
        hdrs.setdefault("Cache-Control", "no-store")
        hdrs["Connection"] = "keep-alive"
        hdrs["X-Accel-Buffering"] = "no"
        self.init_headers(hdrs)

    def close(self) -> None:
        """End the stream (server shutdown): its watcher ends, so `_stream` ends the pump
        however long a lost cancellation would keep it (shared/aio.py)."""
        for task in (self._pump, self._watcher):
            if task is not None:
                task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        if scope["method"] == "HEAD":  # headers only: a body would never end
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await self._stream(receive, send, scope.get(RAW_SEND, send))
        if self.background is not None:
            await self.background()

    async def _stream(self, receive: Receive, send: Send, body_send: Send) -> None:
        pump = self._pump = asyncio.create_task(self._run_pump(body_send))
        watch = self._watcher = asyncio.create_task(self._watch(receive, body_send))
        _open.add(self)
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            _open.discard(self)
            # Cancelled again until done: a pump whose cancellation was lost (a Redis
            # write's wait_for on Python 3.11) would keep its subscription, and the
            # tenant's stream count, until its job ended.
            await aio.cancel_and_wait(pump, watch)
            # The body's own cleanup (unsubscribe, cancel on disconnect), whatever ended it
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        failed = None if pump.cancelled() else pump.exception()
        if failed is not None:
            raise failed  # no last chunk: the client sees a broken stream and resumes
        gone = (watch.done() and not watch.cancelled() and watch.exception() is None
                and watch.result())
        if not gone:  # the events ended, or the server is shutting down: end the body
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Send, chunk: bytes) -> None:
        if not self._inflight:
            self._sending_since = asyncio.get_running_loop().time()
        self._inflight += 1
        try:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._sending_since = None
        self._sent += 1

    async def _run_pump(self, send: Send) -> None:
        async for chunk in self.body_iterator:
            await self._send(send, chunk)

    async def _watch(self, receive: Receive, send: Send) -> bool:
        """Runs beside the pump: True when the client went away (or took nothing for
        send_timeout_s); pings a quiet stream. Wakes once per tick, not per event."""
        loop = asyncio.get_running_loop()
        limit = self._send_timeout_s if self._send_timeout_s > 0 else None
        ticks = [x for x in (self._ping_s, limit and limit / 2) if x]
        tick = min(ticks) if ticks else None  # None: only wait for the client to leave
        seen, quiet_since = self._sent, loop.time()
        due = next_due(float("-inf"), quiet_since, tick) if tick is not None else None
        while True:
            try:
                async with asyncio.timeout_at(due):
                    message = await receive()
                if message["type"] == "http.disconnect":
                    return True
                continue
            except TimeoutError:
                pass
            now = loop.time()
            due = next_due(due, now, tick) if due is not None and tick is not None else None
            stuck = self._sending_since
            if limit is not None and stuck is not None and now - stuck >= limit:
                return True  # the client stopped reading: drop it
            if self._sent != seen:
                seen, quiet_since = self._sent, now
            elif self._ping_s and stuck is None and now - quiet_since >= self._ping_s:
                try:
                    async with asyncio.timeout(limit):
                        await self._send(send, PING)
                except TimeoutError:
                    return True
                seen, quiet_since = self._sent, loop.time()
