"""A size bound and a deadline for a request's header section (431 / 408 in OpenAI's envelope).

uvicorn bounds neither. Its httptools parser gathers a header line however long it grows (20-50
MB lines were read whole and answered 200, with no key; four senders took the API from 188 MB
to 670 MB), and a client that trickles a header line every few seconds holds its connection
for ever (a slowloris). The body has both limits in api/limits.py, but the app sees a request
only once its headers are complete: these limits live in the protocol, where bytes arrive.

- Size: the bytes that arrive while a header section is open (from the end of a request, or
  the connection's start, to the end of the next request's headers; not a body's) are counted,
  one length add a read. A read that would take them past `max_bytes` is fed only up to the
  bound: if the headers have not ended there, the answer is 431 `headers_too_large`, the rest
  is never parsed, and the connection closes. (A pipelined request that starts in the read
  where the one before it ends is counted from the next read: it may hold the bound and one
  read more, at most 256 KiB with asyncio's or uvloop's reads.)
- Time: a header section that spans reads, and a new connection's first one, must be complete
  within `timeout_s` of its first read (or the connection's start), else 408 `request_timeout`
  and the connection closes (a new connection that sent nothing just closes). An idle
  keep-alive connection between requests stays under uvicorn's `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

LINGER_S = 2.0  # after a refusal, the client's bytes are read and dropped, then it is closed


class HeaderLimits(HttpToolsProtocol):
    """uvicorn's httptools protocol with the two limits; `limited()` makes one to configure."""

    max_bytes = 65_536
    timeout_s = 30.0

    _counting = True  # the next bytes belong to a header section (no body is being read)
    _used = 0  # bytes counted towards the open header section
    _heads = 0  # header sections completed on this connection
    _in_head = False  # a request has begun, its headers not complete
    _refused = False
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._timer = self.loop.call_later(self.timeout_s, self._timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        while self._counting and data:
            if self._refused:
                return  # read and dropped until the linger ends
            if self._used + len(data) <= self.max_bytes:  # (the hot path: one add)
                self._used += len(data)
                super().data_received(data)
                data = b""
                continue
            room = self.max_bytes - self._used
            heads = self._heads
            self._used = self.max_bytes
            if room:
                super().data_received(data[:room])
            if self.transport.is_closing():
                return
            if self._heads == heads:  # the bound is reached and the headers go on
                self._refuse(431, "headers_too_large",
                             f"the request's headers are larger than {self.max_bytes} bytes")
                return
            data = data[room:]  # a body's, or the next request's
        if data:  # a body's bytes: nothing to count
            super().data_received(data)
        # A header section left open by this read gets its deadline (once per section).
        if self._counting and self._timer is None and (self._in_head or self._used):
            self._timer = self.loop.call_later(self.timeout_s, self._timed_out)

    def on_message_begin(self) -> None:
        self._in_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._counting = self._in_head = False
        self._used = 0
        self._heads += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._counting = True
        super().on_message_complete()

    def _busy(self) -> bool:
        """A response is in flight or a request waits its turn on this connection."""
        return bool(self.pipeline) or (self.cycle is not None
                                       and not self.cycle.response_complete)

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._counting:
            return
        if self._busy():  # the server is slow here, not the client: wait for it
            self._timer = self.loop.call_later(self.timeout_s, self._timed_out)
        elif self._in_head or self._used:
            self._refuse(408, "request_timeout",
                         f"the request's headers did not arrive within {self.timeout_s:g}s")
        else:
            self.transport.close()  # a new connection that never sent a byte

    def _refuse(self, status: int, code: str, message: str) -> None:
        """The answer in OpenAI's envelope, then the client's further bytes are dropped
        for LINGER_S (closed at once, unread bytes would reset the connection before the
        client reads the answer) and the connection is closed."""
        self._refused = True
        self._counting = True  # every later read goes to data_received's drop
        self.flow.resume_reading()
        if self._busy():  # no answer can go between a response's bytes
            self.transport.close()
            return
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                     "code": code, "param": None}}).encode()
        head = [STATUS_LINE[status]]
        head += [b"%s: %s\r\n" % kv for kv in self.server_state.default_headers]
        head += [b"content-type: application/json\r\n",
                 b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n"]
        self.transport.write(b"".join(head) + body)
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def limited(max_bytes: int, timeout_s: float) -> type[HeaderLimits]:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`) with these limits."""

    class Configured(HeaderLimits):
        pass

    Configured.max_bytes, Configured.timeout_s = max_bytes, timeout_s
    return Configured
