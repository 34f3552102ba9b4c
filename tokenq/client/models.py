"""Typed objects the client returns: events of a job's stream, jobs, lists, files, batches.

Extra fields a newer server sends are kept (`extra="allow"`), so an older client still
reads them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "expired"})
TERMINAL_EVENTS = frozenset({"done", "error", "cancelled"})
BATCH_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class _Event(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None  # the stream entry id: what Last-Event-ID resumes after

    @property
    def terminal(self) -> bool:
        return False


class QueuedEvent(_Event):
    type: Literal["queued"] = "queued"
    # jobs taken before it, seconds until it starts (estimated; None: not known yet) and
    # why it waits ("waiting", or "loading" while its model loads); re-sent as they change
    position: int | None = None
    eta_s: float | None = None
    reason: str | None = None


class StartedEvent(_Event):
    type: Literal["started"] = "started"
    attempt: int
    worker: str


class TokenEvent(_Event):
    type: Literal["token"] = "token"
    text: str
    index: int


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class DoneEvent(_Event):
    type: Literal["done"] = "done"
    finish_reason: str | None = None
    usage: Usage | None = None

    @property
    def terminal(self) -> bool:
        return True


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str
    message: str

    @property
    def terminal(self) -> bool:
        return True


class CancelledEvent(_Event):
    type: Literal["cancelled"] = "cancelled"

    @property
    def terminal(self) -> bool:
        return True


Event = Annotated[QueuedEvent | StartedEvent | TokenEvent | DoneEvent | ErrorEvent
                  | CancelledEvent, Field(discriminator="type")]
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
KNOWN_EVENTS = frozenset({"queued", "started", "token", "done", "error", "cancelled"})


def parse_event(entry_id: str | None, event: str, data: dict[str, Any]) -> Event:
    return _EVENT.validate_python({**data, "type": event, "id": entry_id})


class JobError(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str
    message: str


class Job(BaseModel):
    """A job as POST /v1/jobs (`status` only) and GET /v1/jobs/{id} (everything) answer."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "job"
    status: str
    model: str
    created_at: float
    stream_url: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int | None = None
    output: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    error: JobError | None = None
    metadata: dict[str, str] | None = None
    # while queued: jobs taken before it, seconds until it starts (estimated), why it waits
    position: int | None = None
    eta_s: float | None = None
    reason: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATES


class JobList(BaseModel):
    """One page of GET /v1/jobs; pass `last_id` as `after` for the next one."""

    model_config = ConfigDict(extra="allow")

    object: str = "list"
    data: list[Job]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileObject(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "file"
    bytes: int
    filename: str
    purpose: str


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "batch"
    status: str
    endpoint: str
    input_file_id: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    errors: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None

    @property
    def done(self) -> bool:
        return self.status in BATCH_TERMINAL
