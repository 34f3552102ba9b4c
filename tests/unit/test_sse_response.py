"""The API's event-stream response (api/sse.py) on a stand-in ASGI connection: the event
format, keep-alive pings on a quiet stream, a client that stops reading dropped after the
send timeout, a disconnect and a shutdown ending the stream, and the body's cleanup run
whatever ended it. Every wait has a deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tokenq.api import sse
from tokenq.client.sse import SSEParser

DEADLINE_S = 5.0


class Conn:
    """An ASGI connection: `sent` records every message; `block` makes body sends wait
    (a client that stopped reading); `leave()` makes receive() report a disconnect."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.block = False
        self._gone = asyncio.Event()
        self._asked = 0

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        self._asked += 1
        if self._asked == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.block and message["type"] == "http.response.body":
            await asyncio.Event().wait()
        self.sent.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent
                        if m["type"] == "http.response.body")

    def ended(self) -> bool:
        return any(m["type"] == "http.response.body" and not m["more_body"] for m in self.sent)


class Body:
    """A body iterator that yields what is put into it; `closed` once its cleanup ran."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = asyncio.Event()

    async def gen(self) -> AsyncIterator[bytes]:
        try:
            while (item := await self.items.get()) is not None:
                yield item
        finally:
            self.closed.set()


class LosesACancel(Body):
    """A body whose first cancellation is lost, as Python 3.11's asyncio.wait_for loses one
    that lands as the call it wraps finishes (a Redis write: shared/aio.py)."""

    async def gen(self) -> AsyncIterator[bytes]:
        lost = False
        try:
            while True:
                try:
                    item = await self.items.get()
                except asyncio.CancelledError:
                    if lost:
                        raise
                    lost = True
                    continue
                if item is None:
                    return
                yield item
        finally:
            self.closed.set()


SCOPE = {"type": "http", "method": "GET"}


def stream(conn: Conn, body: Body, *, ping_s: float = 10,
           send_timeout_s: float = 30) -> asyncio.Task[None]:
    """An EventStream of `body` running on `conn`."""
    resp = sse.EventStream(body.gen(), ping_s=ping_s, send_timeout_s=send_timeout_s)
    return asyncio.create_task(resp(SCOPE, conn.receive, conn.send))


async def until(cond: Any) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not cond():
            await asyncio.sleep(0.005)


def test_event_format_round_trips_through_the_client_parser() -> None:
    raw = (sse.event('{"text": "a"}', event="token", id="1-0")
           + sse.event("two\nlines\r\nhere", id="2-0\nevent: forged")
           + sse.event("[DONE]"))
    assert raw.startswith(b'id: 1-0\r\nevent: token\r\ndata: {"text": "a"}\r\n\r\n')
    events = SSEParser().feed(raw)
    assert [(e.id, e.event, e.data) for e in events] == [
        ("1-0", "token", '{"text": "a"}'),
        ("2-0event: forged", "message", "two\nlines\nhere"),
        (None, "message", "[DONE]")]


def test_events_then_the_last_chunk_and_the_body_closed() -> None:
    async def main() -> None:
        conn, body = Conn(), Body()
        task = stream(conn, body, ping_s=0, send_timeout_s=30)
        for i in range(3):
            body.items.put_nowait(sse.event(str(i), id=f"{i}-0"))
        body.items.put_nowait(None)
        await asyncio.wait_for(task, DEADLINE_S)
        assert conn.sent[0]["type"] == "http.response.start"
        assert dict(conn.sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
        assert conn.body().count(b"data: ") == 3 and conn.ended() and body.closed.is_set()
    asyncio.run(main())


def test_a_quiet_stream_is_pinged() -> None:
    async def main() -> None:
        conn, body = Conn(), Body()
        task = stream(conn, body, ping_s=0.05, send_timeout_s=30)
        await until(lambda: conn.body().count(sse.PING) >= 2)
        body.items.put_nowait(None)
        await asyncio.wait_for(task, DEADLINE_S)
    asyncio.run(main())


def test_a_client_that_stops_reading_is_dropped_after_the_send_timeout() -> None:
    async def main() -> None:
        conn, body = Conn(), Body()
        task = stream(conn, body, ping_s=10, send_timeout_s=0.2)
        body.items.put_nowait(sse.event("first"))
        await until(lambda: b"first" in conn.body())
        conn.block = True
        body.items.put_nowait(sse.event("never taken"))
        await asyncio.wait_for(task, DEADLINE_S)  # without the timeout: waits forever
        assert body.closed.is_set() and not conn.ended()
    asyncio.run(main())


def test_a_disconnect_ends_the_stream_and_runs_the_body_cleanup() -> None:
    async def main() -> None:
        conn, body = Conn(), Body()
        task = stream(conn, body, ping_s=10, send_timeout_s=30)
        body.items.put_nowait(sse.event("x"))
        await until(lambda: b"x" in conn.body())
        conn.leave()
        await asyncio.wait_for(task, DEADLINE_S)
        assert body.closed.is_set() and not conn.ended()
    asyncio.run(main())


@pytest.mark.parametrize("end", ["disconnect", "shutdown"])
def test_a_stream_whose_body_lost_a_cancellation_still_ends(end: str) -> None:
    """Before: the stream waited on its body forever (or until its job ended), holding its
    subscription and the tenant's stream count, and a SIGTERM waited the whole drain."""
    async def main() -> None:
        conn, body = Conn(), LosesACancel()
        task = stream(conn, body, ping_s=10, send_timeout_s=30)
        body.items.put_nowait(sse.event("x"))
        await until(lambda: b"x" in conn.body())
        if end == "disconnect":
            conn.leave()
        else:
            sse.close_all()
        await asyncio.wait_for(task, DEADLINE_S)
        assert body.closed.is_set()
        assert conn.ended() == (end == "shutdown")  # a shutdown ends the body cleanly
    asyncio.run(main())


def test_shutdown_ends_every_open_stream_cleanly() -> None:
    async def main() -> None:
        pairs = [(Conn(), Body()) for _ in range(3)]
        tasks = [asyncio.create_task(sse.EventStream(b.gen(), ping_s=10, send_timeout_s=30)(
            SCOPE, c.receive, c.send)) for c, b in pairs]
        await until(lambda: all(c.sent for c, _ in pairs))
        await asyncio.sleep(0.01)
        sse.close_all()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
        assert all(c.ended() and b.closed.is_set() for c, b in pairs)
    asyncio.run(main())


def test_a_failing_body_is_raised_without_a_clean_end() -> None:
    async def broken() -> AsyncIterator[bytes]:
        yield sse.event("x")
        raise RuntimeError("redis went away")

    async def main() -> None:
        conn = Conn()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(sse.EventStream(broken(), ping_s=10, send_timeout_s=30)(
                SCOPE, conn.receive, conn.send), DEADLINE_S)
        assert b"x" in conn.body() and not conn.ended()
    asyncio.run(main())


def test_head_sends_headers_only() -> None:
    async def main() -> None:
        conn, body = Conn(), Body()
        resp = sse.EventStream(body.gen(), ping_s=10, send_timeout_s=30)
        await asyncio.wait_for(resp({"type": "http", "method": "HEAD"}, conn.receive,
                                    conn.send), DEADLINE_S)
        assert conn.ended() and conn.body() == b""
    asyncio.run(main())


def test_events_skip_the_middlewares_send_wrappers_under_raw_send() -> None:
    """With RawSend outermost, a middleware's send wrapper sees the response start (the
    access log's status) and the end, not each event; the client gets them all."""
    async def main() -> None:
        conn, body = Conn(), Body()
        wrapped: list[str] = []

        async def app(scope: Any, receive: Any, send: Any) -> None:
            async def counting(message: dict[str, Any]) -> None:  # a middleware's wrapper
                wrapped.append(message["type"])
                await send(message)
            await sse.EventStream(body.gen(), ping_s=0, send_timeout_s=30)(
                scope, receive, counting)

        task = asyncio.create_task(sse.RawSend(app)(dict(SCOPE), conn.receive, conn.send))
        for i in range(5):
            body.items.put_nowait(sse.event(str(i)))
        body.items.put_nowait(None)
        await asyncio.wait_for(task, DEADLINE_S)
        assert conn.body().count(b"data: ") == 5 and conn.ended()
        assert wrapped == ["http.response.start", "http.response.body"]  # start and end
    asyncio.run(main())
