"""What the sync and async clients share: settings, SSE framing, the resume state machine,
retry policy and errors. No I/O here."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tokenq import __version__
from tokenq.client.models import KNOWN_EVENTS, Event, TokenEvent, parse_event

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


def job_body(model: str, prompt: str | None, messages: list[dict[str, Any]] | None,
             params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, **{k: v for k, v in params.items()
                                               if v is not None}}
    if prompt is not None:
        body["prompt"] = prompt
    if messages is not None:
        body["messages"] = messages
    return body


def list_params(state: str | None, model: str | None, metadata: dict[str, str] | None,
                limit: int, after: str | None) -> dict[str, str]:
    q: dict[str, str] = {"limit": str(limit)}
    if state:
        q["state"] = state
    if model:
        q["model"] = model
    if after:
        q["after"] = after
    for k, v in (metadata or {}).items():
        q[f"metadata[{k}]"] = v
    return q


class SSEDecoder:
    """SSE framing, one line at a time: fields until a blank line; ':' lines are pings.
    A message is returned only when its blank line arrives, so a connection cut in the
    middle of one never yields half of it."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str | None, str, str] | None:
        if line == "":
            out = (self._id, self._event, "\n".join(self._data)) if self._data else None
            self._id, self._event, self._data = None, "message", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


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

    def accept(self, raw: tuple[str | None, str, str]) -> Event | None:
        """The typed event to deliver, or None (a duplicate, or an event type this client
        does not know)."""
        entry_id, name, data = raw
        if name not in KNOWN_EVENTS:
            if entry_id:
                self.last_id = entry_id
            return None
        ev = parse_event(entry_id, name, json.loads(data))
        if isinstance(ev, TokenEvent):
            if ev.index < self.next_index:
                return None
            self.next_index = ev.index + 1
        if entry_id:
            self.last_id = entry_id
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
        return float(min(self.cap_s, self.base_s * 2 ** (self.failures - 1)))

    def progressed(self) -> None:
        self.failures = 0


def delay_s(tries: int, base_s: float = 0.1, cap_s: float = 2.0) -> float:
    return float(min(cap_s, base_s * 2 ** (tries - 1)))


def retry_after_s(resp: httpx.Response, default: float) -> float:
    try:
        return min(30.0, float(resp.headers.get("Retry-After", default)))
    except ValueError:
        return default
