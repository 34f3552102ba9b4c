"""Server-Sent Events, the wire format (the WHATWG HTML standard, "event stream
interpretation"): an incremental parser that both clients, the CLI and the tests read
streams with, and a one-connection reader of a job's events as the server sends them.

The parser takes text (or UTF-8 bytes) in chunks of any size, cut anywhere, and returns
each message once its blank line has arrived: a message the connection cuts in the middle
is never returned. Lines end in CRLF, LF or CR (a CR at the end of one chunk and an LF at
the start of the next are one line end); `data` lines join with LF; `event`, `id` and
`retry` are kept; lines starting with ':' are comments (keep-alives); unknown fields are
ignored; a message without data is not dispatched."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Message:
    """One dispatched message. `id` is the id field the message carried (None when it had
    none); `SSEParser.last_event_id` keeps the standard's running last event id."""

    event: str = "message"
    data: str = ""
    id: str | None = None


class SSEParser:
    """An event stream, fed chunk by chunk (`feed`) or line by line (`feed_line`)."""

    def __init__(self) -> None:
        self.last_event_id = ""  # what a reconnection sends as Last-Event-ID
        self.retry_ms: int | None = None  # the server's reconnection time, if it set one
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial: list[str] = []  # the current line, not ended yet
        self._after_cr = False  # the last chunk ended in CR: a leading LF is its CRLF
        self._started = False  # a BOM is stripped only at the very start of the stream
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, chunk: str | bytes) -> list[Message]:
        """The messages this chunk completes, in order."""
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        self._after_cr = text.endswith("\r")
        *ended, rest = _LINE_END.split(text)
        out: list[Message] = []
        for n, piece in enumerate(ended):
            if n == 0 and self._partial:
                piece = "".join(self._partial) + piece
                self._partial.clear()
            msg = self.feed_line(piece)
            if msg is not None:
                out.append(msg)
        if rest:
            self._partial.append(rest)
        return out

    def feed_line(self, line: str) -> Message | None:
        """One line, its line end already taken off: the message a blank line completes."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry_ms = int(value)
        return None

    def _dispatch(self) -> Message | None:
        msg = (Message(self._event or "message", "\n".join(self._data), self._id)
               if self._data else None)
        self._event, self._data, self._id = "", [], None
        return msg


def iter_messages(chunks: Iterable[str | bytes]) -> Iterator[Message]:
    parser = SSEParser()
    for chunk in chunks:
        yield from parser.feed(chunk)


@dataclass(slots=True)
class RawEvent:
    """A job's event as the wire carries it, its data decoded from JSON but not typed
    (the client's typed events are tokenq.client.Event)."""

    id: str | None
    event: str
    data: dict[str, Any]

    @classmethod
    def from_message(cls, msg: Message) -> RawEvent:
        return cls(msg.id, msg.event, json.loads(msg.data))


def parse_lines(lines: Iterable[str]) -> Iterator[RawEvent]:
    """Lines already split (httpx's `iter_lines`, a list in a test) -> events."""
    parser = SSEParser()
    for line in lines:
        msg = parser.feed_line(line)
        if msg is not None:
            yield RawEvent.from_message(msg)


def stream_events(client: httpx.Client, job_id: str, last_event_id: str | None = None,
                  timeout: float | None = None) -> Iterator[RawEvent]:
    """GET /v1/jobs/{id}/events on one connection, no resume: every event the server
    sends, until it closes. An error status raises httpx.HTTPStatusError."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                       timeout=timeout) as resp:
        resp.raise_for_status()
        for msg in iter_messages(resp.iter_text()):
            yield RawEvent.from_message(msg)
