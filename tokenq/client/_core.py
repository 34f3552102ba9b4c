"""What the sync and async clients share, with no I/O: settings, errors, the replica in
use, retry and backoff decisions, and a stream's resume state machine. The clients
(sync.py, aio.py) only send what this decides and sleep as long as it says."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import httpx

from tokenq import __version__
from tokenq.client.models import KNOWN_EVENTS, Batch, Event, TokenEvent, parse_event
from tokenq.client.sse import Message, SSEParser

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
# Statuses worth another try on another (or the same) replica: draining, overloaded,
# or a proxy in front that lost its upstream.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
TRANSPORT_ERRORS = (httpx.TransportError,)


class TokenqError(Exception):
    """Base class of the client's errors."""


class APIError(TokenqError):
    """The API answered with an error (OpenAI's envelope): status, code, message, param."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, type_: str | None = None) -> None:
        super().__init__(f"{status} {code or ''}: {message}".replace(" :", ":"))
        self.status, self.message, self.code, self.param, self.type = (
            status, message, code, param, type_)

    @classmethod
    def from_response(cls, resp: httpx.Response) -> APIError:
        try:
            err = resp.json()["error"]
            return cls(resp.status_code, str(err.get("message")), err.get("code"),
                       err.get("param"), err.get("type"))
        except (ValueError, KeyError, TypeError):
            return cls(resp.status_code, resp.text[:200] or resp.reason_phrase)


class StreamGaveUp(TokenqError):
    """The stream could not be resumed within the client's retry budget."""


def base_urls(base_url: str | Sequence[str] | None) -> list[str]:
    """An explicit URL or list, else TOKENQ_BASE_URL (comma-separated), else localhost."""
    raw = base_url if base_url is not None else os.environ.get("TOKENQ_BASE_URL",
                                                               DEFAULT_BASE_URL)
    urls = [u.strip() for u in raw.split(",")] if isinstance(raw, str) else list(raw)
    urls = [u.rstrip("/") for u in urls if u]
    if not urls:
        raise ValueError("no base URL given")
    return urls


def headers_for(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("TOKENQ_API_KEY")
    h = {"User-Agent": f"tokenq-client/{__version__}"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


def new_idempotency_key() -> str:
    return "tq-" + uuid.uuid4().hex


@dataclass
class Resume:
    """Where a job's stream stands for its caller, across connections and replicas.

    `last_id` is the id of the last event handed to the caller: the next connection asks
    for what comes after it, so an event is delivered at most once. Token indexes are
    checked too (a token at or below the last delivered index is dropped), and the
    stream ends only with a terminal event, so a cut that looks like a clean close is
    resumed, not mistaken for the end."""

    job_id: str
    last_id: str | None = None
    next_index: int = 0
    finished: bool = False
    connections: int = 0
    urls_tried: list[str] = field(default_factory=list)

    def request_headers(self) -> dict[str, str]:
        return {"Last-Event-ID": self.last_id} if self.last_id else {}

    def accept(self, msg: Message) -> Event | None:
        """The typed event to deliver, or None (a duplicate, or an event type this client
        does not know)."""
        if msg.event not in KNOWN_EVENTS:
            if msg.id:
                self.last_id = msg.id
            return None
        ev = parse_event(msg.id, msg.event, json.loads(msg.data))
        if isinstance(ev, TokenEvent):
            if ev.index < self.next_index:
                return None
            self.next_index = ev.index + 1
        if msg.id:
            self.last_id = msg.id
        if ev.terminal:
            self.finished = True
        return ev


@dataclass
class Backoff:
    """Exponential backoff with a budget of consecutive failures; progress resets it."""

    base_s: float = 0.1
    cap_s: float = 2.0
    max_failures: int = 20
    failures: int = 0

    def failed(self) -> float:
        """Seconds to wait before the next try; raises StreamGaveUp past the budget."""
        self.failures += 1
        if self.failures > self.max_failures:
            raise StreamGaveUp(f"gave up after {self.max_failures} failed attempts in a row")
        return delay_s(self.failures, self.base_s, self.cap_s)

    def progressed(self) -> None:
        self.failures = 0


def delay_s(tries: int, base_s: float = 0.1, cap_s: float = 2.0) -> float:
    return float(min(cap_s, base_s * 2 ** (tries - 1)))


def retry_after_s(resp: httpx.Response, default: float) -> float:
    try:
        return min(30.0, float(resp.headers.get("Retry-After", default)))
    except ValueError:
        return default


class Deadline:
    """`check()` raises TimeoutError("<what> did not end within <timeout> s") once
    `timeout` seconds have passed; never when `timeout` is None."""

    def __init__(self, what: str, timeout: float | None) -> None:
        self.what, self.timeout = what, timeout
        self._at = None if timeout is None else time.monotonic() + timeout

    def error(self) -> TimeoutError:
        return TimeoutError(f"{self.what} did not end within {self.timeout} s")

    def check(self) -> None:
        if self._at is not None and time.monotonic() > self._at:
            raise self.error()


class BatchWatch:
    """`wait_batch`'s decisions: whether a poll is progress to report, and whether to stop
    (the batch ended; TimeoutError past the deadline)."""

    def __init__(self, batch_id: str, timeout: float | None) -> None:
        self._deadline = Deadline(f"batch {batch_id}", timeout)
        self._last: Batch | None = None

    def changed(self, batch: Batch) -> bool:
        before, self._last = self._last, batch
        return before is None or (before.status, before.request_counts) != (
            batch.status, batch.request_counts)

    def ended(self, batch: Batch) -> bool:
        if batch.done:
            return True
        self._deadline.check()
        return False


H = TypeVar("H", httpx.Client, httpx.AsyncClient)


class ClientCore(Generic[H]):
    """All of a client but its I/O: the replicas and the one in use (requests and streams
    move to the next when one fails), timeouts, retry budgets, the latest stream."""

    def __init__(self, base_url: str | Sequence[str] | None, api_key: str | None,
                 timeout: float, stream_read_timeout: float, max_retries: int,
                 max_stream_failures: int, http: H) -> None:
        self.urls = base_urls(base_url)
        self._current = 0
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self.max_retries = max_retries
        self.max_stream_failures = max_stream_failures
        self._http: H = http
        self._http.headers.update(headers_for(api_key))
        # The latest stream's resume state (connections made, URLs used): for diagnostics.
        self.last_stream: Resume | None = None

    @property
    def base_url(self) -> str:
        return self.urls[self._current]

    def _rotate(self) -> None:
        self._current = (self._current + 1) % len(self.urls)

    def _attempts(self, retry: bool) -> Attempts:
        return Attempts(self, self.max_retries if retry else 0)

    def _open_stream(self, job_id: str, last_event_id: str | None) -> StreamSession:
        session = StreamSession(self, job_id, last_event_id)
        self.last_stream = session.resume
        return session


class Attempts:
    """One request's tries: after each outcome, the seconds to wait before the next try on
    the next replica, or None (a transport error: raise it; an answer: it is final). A
    dropped connection or a 429/502/503/504 is tried again up to `max_retries` times."""

    def __init__(self, core: ClientCore[Any], max_retries: int) -> None:
        self._core, self._max, self._tries = core, max_retries, 0

    def failed(self) -> float | None:
        self._core._rotate()
        if self._tries >= self._max:
            return None
        self._tries += 1
        return delay_s(self._tries)

    def answered(self, resp: httpx.Response) -> float | None:
        """Also raises APIError for an error status not tried again."""
        if resp.status_code in RETRY_STATUSES and self._tries < self._max:
            self._tries += 1
            self._core._rotate()
            return max(delay_s(self._tries), retry_after_s(resp, 0.0))
        if resp.status_code >= 400:
            raise APIError.from_response(resp)
        return None


Answer = Literal["end", "retry", "error", "read"]


class StreamSession:
    """One `stream()`: the URL and Last-Event-ID of each connection, what its status means
    ("end": 204, nothing can follow; "retry": try again, after Retry-After; "error": raise
    it; "read": events follow), the events to deliver from its body, and how long to wait
    before the next connection on the next replica (StreamGaveUp past the budget)."""

    def __init__(self, core: ClientCore[Any], job_id: str, last_event_id: str | None) -> None:
        self._core = core
        self.resume = Resume(job_id, last_id=last_event_id)
        self._backoff = Backoff(max_failures=core.max_stream_failures)
        self._parser, self._url, self._got, self._delay = SSEParser(), "", 0, 0.0

    @property
    def finished(self) -> bool:
        return self.resume.finished

    def connect(self) -> tuple[str, dict[str, str]]:
        """The next connection's URL and headers. Each connection parses afresh: a message
        cut in the middle by the last one is never delivered."""
        self._parser, self._got, self._delay = SSEParser(), 0, 0.0
        self._url = self._core.base_url
        return (f"{self._url}/v1/jobs/{self.resume.job_id}/events",
                self.resume.request_headers())

    def opened(self, resp: httpx.Response) -> Answer:
        self.resume.connections += 1
        self.resume.urls_tried.append(self._url)
        if resp.status_code == 204:
            return "end"
        if resp.status_code in RETRY_STATUSES:
            self._delay = retry_after_s(resp, 0.0)
            return "retry"
        return "error" if resp.status_code >= 400 else "read"

    def feed(self, chunk: str) -> list[Event]:
        """The events this chunk of the body completes, to deliver in order; none after
        the terminal one."""
        out: list[Event] = []
        for msg in self._parser.feed(chunk):
            self._got += 1
            self._backoff.progressed()
            ev = self.resume.accept(msg)
            if ev is not None:
                out.append(ev)
            if self.resume.finished:
                break
        return out

    def may_have_ended(self) -> bool:
        """After a connection that brought nothing (no Retry-After either), whether to ask
        for the job's state: a caller whose Last-Event-ID is at or after the terminal
        event has nothing more to receive."""
        return (self._got == 0 and self._delay == 0.0 and self.resume.last_id is not None
                and self.resume.connections > 1)

    def retry_in(self) -> float:
        self._core._rotate()
        return max(self._delay, self._backoff.failed())
