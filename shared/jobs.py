"""The job state machine, lease and fencing: each transition one Lua script, atomic in Redis.

    create   (api)     record + a ticket on its lane + its id in its tenant's list + `queued`
                       event, or refuse if a queue is full
    pick     (worker)  a ticket's take: the next job of the lane's fairest tenant, acquired
    acquire  (worker)  queued|running-without-lease -> running, attempts += 1, lease set,
                       `started` event; or drop (terminal, live lease), expire or exhaust
                       (a message that names its job: takeover, preempted, handed back)
    append   (worker)  token events, only while `attempts` still equals the writer's attempt;
                       answers where the stream really ends (a failover may have lost tokens)
    finish   (worker)  running -> succeeded|failed|cancelled with its terminal event, once
                       (and, for the publisher, only once the stream holds every token sent)
    cancel   (api)     queued -> cancelled at once; running -> cancel_requested=1, or
                       left to finish (queued_only: a batch's cancel)
    renew    (worker)  extend the lease only while it is still ours (retake it if it
                       expired and no newer attempt took the job)
    requeue  (worker)  a job no message will deliver goes back on its queue (takeover,
                       lost message)
    handback (worker)  a draining worker puts its running job back (same takeover path)
    preempt  (worker)  running -> queued again, lease dropped, tokens kept, preemptions += 1:
                       room for a waiting higher-priority job or a tenant served far less
                       (resumed like a takeover; shared/preemption.py)
    reject   (api)     a batch line that cannot be enqueued: its record, ended `failed`
    move     (worker)  a queued job to another pool of its model (shared/moves.py)

The attempt check on every worker write is the fence: a worker that lost its lease
(paused, partitioned) and comes back cannot write into a stream that a newer attempt
now owns.

This module is the protocol: what each script takes (a `Call`: script, KEYS, ARGV, and
how to read its answer) and the typed results it answers with. The stores run the calls
(shared/store.py sync and asyncio, api/store.py); nothing else builds KEYS or ARGV.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from tokenq.shared import keys
from tokenq.shared.schemas import JobErrorInfo, JobSpec

T = TypeVar("T")
Arg = str | int | float


def dumps(obj: Any) -> str:
    """Compact JSON, the only encoding on the wire and in Redis."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def lease_value(worker: str, attempt: int) -> str:
    return f"{worker}|{attempt}"


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One script run: its name in shared/lua/, KEYS, ARGV, and its answer decoded."""

    script: str
    keys: list[str]
    args: list[Arg]
    decode: Callable[[Any], T]


@dataclass(frozen=True, slots=True)
class FairShare:
    """How lanes order their tenants (shared/lua/fair.lua): by weighted service with this
    half-life, or FIFO (arrival order)."""

    half_s: float = 30.0
    fifo: bool = False

    def args(self) -> list[Arg]:
        return [repr(self.half_s), "1" if self.fifo else "0"]


# -- results ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Created:
    depth: int  # jobs ahead of it in its queue
    # jobs taken before it, seconds until it starts (None: not known): shared/eta.py
    position: int = field(default=0, compare=False)
    eta_s: float | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Exists:
    """The id was already there (batch lines are created idempotently)."""


@dataclass(frozen=True, slots=True)
class QueueFull:
    depth: int


@dataclass(frozen=True, slots=True)
class TenantFull:
    queued: int  # the tenant's jobs still queued


@dataclass(frozen=True, slots=True)
class Replayed:
    """The Idempotency-Key's job, made by an earlier request with the same body."""

    job_id: str


@dataclass(frozen=True, slots=True)
class KeyReused:
    """The Idempotency-Key's job was made by a request with another body."""

    job_id: str


@dataclass(frozen=True, slots=True)
class IdemKey:
    """An Idempotency-Key as the create script takes it: where its record lives, the
    request body's sha256 and how long the record is kept."""

    redis_key: str
    body_sha: str
    ttl_s: int


CreateResult = Created | Exists | QueueFull | TenantFull | Replayed | KeyReused


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to create, as `create` takes it (AsyncJobStore.create_many: a batch's lines).
    `queue_limit` None: the settings' queue limit."""

    job_id: str
    fields: dict[str, str]
    tenant: str
    queue: str
    message: str
    now: float
    queue_limit: int | None = None
    tenant_limit: int = 0


@dataclass(frozen=True, slots=True)
class NewRejection:
    """A batch line that cannot be enqueued, as `reject` takes it: its record ends `state`."""

    job_id: str
    fields: dict[str, str]
    tenant: str
    error: JobErrorInfo
    ttl: int
    now: float
    state: Literal["failed", "cancelled"] = "failed"  # cancelled: left out by its cancel


class SkipReason(enum.StrEnum):
    """Why a delivered message did not run its job."""

    MISSING = "missing"  # no such job (expired record)
    TERMINAL = "terminal"  # a redelivered copy of an ended job
    BUSY = "busy"  # a copy delivered while another attempt holds the lease
    EXPIRED = "expired"  # past its deadline: ended `expired` here
    EXHAUSTED = "exhausted"  # max_attempts reached: ended `failed` here
    POISON = "poison"  # a worker died compiling its grammar: ended `failed` here


@dataclass(frozen=True, slots=True)
class Acquired:
    attempt: int
    spec: JobSpec
    cancel_requested: bool  # cancelled while its message was on the way


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: SkipReason


AcquireResult = Acquired | Skipped


@dataclass(frozen=True, slots=True)
class Picked:
    """A ticket's take: the job it chose, and what leasing it answered."""

    job_id: str
    result: AcquireResult


@dataclass(frozen=True, slots=True)
class NoJob:
    """A ticket that found no job: 'empty' (none waits) or 'stale' (only ids of jobs no
    longer queued, skipped); a direct take: 'no_ticket' (none at the queue's end)."""

    reason: str


PickResult = Picked | NoJob


class Appended(enum.IntEnum):
    FENCED = 0  # a newer attempt owns the job, or it ended
    WRITTEN = 1
    CANCEL_REQUESTED = 2  # written, and the job's cancel was requested: stop it now


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What `append` answered: its status, where the stream really ends (`stream_end` tokens,
    -1 when fenced: fewer than the writer has sent means a failover lost the rest, to
    re-send from that index), and the entry ids of the tokens this call wrote (indexes
    stream_end - len(ids) .. stream_end - 1)."""

    status: Appended
    stream_end: int
    ids: tuple[str, ...] = ()


class Ended(enum.IntEnum):
    FENCED = 0  # a newer attempt owns the job, or it ended
    ENDED = 1
    SHORT = 2  # not ended: the stream lacks tokens the writer sent (lost in a failover)


@dataclass(frozen=True, slots=True)
class FinishResult:
    status: Ended
    stream_end: int  # the stream's token count when the script ran


class Cancelled(enum.StrEnum):
    MISSING = "missing"
    CANCELLED = "cancelled"  # was queued (ended here), or was cancelled already
    REQUESTED = "requested"  # running: its worker stops it
    LEFT = "left"  # running, left to finish (a cancel of queued jobs only)
    ENDED = "ended"  # already succeeded, failed or expired


@dataclass(frozen=True, slots=True)
class TokenWrite:
    data: str  # the event's JSON ({"text", "index"})
    token_id: int
    index: int
    # The entry id the stream gave this token before a failover lost it ("" for a new
    # token): a re-send keeps it where it can, so a client that saw it never sees it twice.
    entry_id: str = ""


@dataclass(frozen=True, slots=True)
class Ending:
    """A terminal write: the state, the record's fields, and the terminal event."""

    job_id: str
    attempt: int
    state: str
    fields: dict[str, str]
    event: str
    data: str
    # The stream's token count the writer has sent: the job ends only once the stream holds
    # them all (None: not checked).
    tokens: int | None = None


# -- decoders --------------------------------------------------------------------------
def _created(got: list[Any]) -> CreateResult:
    code = int(got[0])
    if code in (3, 4):
        job_id = got[1].decode() if isinstance(got[1], bytes) else str(got[1])
        return Replayed(job_id) if code == 3 else KeyReused(job_id)
    n = int(got[1])
    if code == 1:
        ms = int(got[3]) if len(got) > 3 else -1
        return Created(n, int(got[2]) if len(got) > 2 else n, None if ms < 0 else ms / 1000)
    if code == 2:
        return Exists()
    return QueueFull(n) if code == -1 else TenantFull(n)


def _acquired(got: list[Any]) -> AcquireResult:
    if got[0] != "ok":
        return Skipped(SkipReason(got[0]))
    return Acquired(int(got[1]), JobSpec.model_validate_json(got[2]), got[3] == "1")


def _picked(got: list[Any]) -> PickResult:
    if got[0] in ("empty", "stale", "no_ticket"):
        return NoJob(got[0])
    return Picked(got[1], _acquired([got[0], *got[2:]]))


def _cancelled(got: str | None) -> Cancelled:
    said = {"cancelled": Cancelled.CANCELLED, "left": Cancelled.LEFT,
            "running": Cancelled.REQUESTED}
    return Cancelled.MISSING if not got else said.get(got, Cancelled.ENDED)


def _flag(got: Any) -> bool:
    return bool(got)


def text(x: Any) -> str:
    """A script's reply item as text (bytes where the client does not decode)."""
    return x.decode() if isinstance(x, bytes) else str(x)


def _appended(got: list[Any]) -> AppendResult:
    return AppendResult(Appended(int(got[0])), int(got[1]), tuple(text(x) for x in got[2:]))


def _finished(got: list[Any]) -> FinishResult:
    return FinishResult(Ended(int(got[0])), int(got[1]))


# -- calls -----------------------------------------------------------------------------
def create(job_id: str, fields: dict[str, str], *, tenant: str, queue: str, message: str,
           queue_limit: int, tenant_limit: int, maxlen: int, now: float,
           idem: IdemKey | None = None, fair: FairShare,
           index_horizon_s: float = 0.0) -> Call[CreateResult]:
    """Batch lines are counted apart from the tenant's own queued jobs: a large batch must
    not lock its tenant out of interactive requests. With an Idempotency-Key the answer may
    be the key's earlier job (`Replayed`, `KeyReused`) instead of a new one. `message` is
    the lane's ticket (celery_app.ticket_message). The tenant's job index drops ids older
    than `index_horizon_s` (0: never), past every job's retention."""
    queued_set = keys.tenant_queued(tenant, batch="batch" in fields)
    lane = keys.lane(queue)
    script_keys = [keys.job(job_id), keys.job_events(job_id), queue, keys.tenant_jobs(tenant),
                   queued_set, keys.QUEUED, keys.lane_tenants(lane),
                   keys.lane_list(lane, tenant), keys.share(tenant)]
    args: list[Arg] = [dumps(fields), message, queue_limit, maxlen, repr(now), tenant_limit,
                       "" if idem is None else idem.body_sha,
                       "" if idem is None else idem.ttl_s, lane, tenant, *fair.args(),
                       index_horizon_s]
    if idem is not None:
        script_keys.append(idem.redis_key)
    return Call("create", script_keys, args, _created)


def pick(queue: str, *, worker: str, lease_ms: int, max_attempts: int, now: float,
         maxlen: int, ttl: int, fair: FairShare, ticket_mark: str = "",
         above: Sequence[str] = ()) -> Call[PickResult]:
    """`ticket_mark`: a direct take (the ticket at the queue's end too, none while the
    queues `above` hold messages)."""
    lane = keys.lane(queue)
    return Call("pick", [keys.lane_tenants(lane), keys.RUNNING, queue, *above],
                [lane, worker, lease_ms, max_attempts, repr(now), maxlen, ttl, *fair.args(),
                 ticket_mark], _picked)


def reject(job_id: str, fields: dict[str, str], *, tenant: str, error: JobErrorInfo,
           now: float, maxlen: int, ttl: int, state: str = "failed") -> Call[bool]:
    """A batch line that could not be enqueued: its record, ended `state` (never queued)."""
    return Call("reject", [keys.job(job_id), keys.job_events(job_id), keys.RUNNING,
                           keys.tenant_jobs(tenant)],
                [dumps(fields), error.model_dump_json(), repr(now), maxlen, ttl, state], _flag)


def acquire(job_id: str, *, worker: str, lease_ms: int, max_attempts: int, now: float,
            maxlen: int, ttl: int) -> Call[AcquireResult]:
    return Call("acquire", [keys.job(job_id), keys.job_events(job_id), keys.job_lease(job_id),
                            keys.RUNNING],
                [worker, lease_ms, max_attempts, repr(now), maxlen, ttl], _acquired)


def append(job_id: str, attempt: int, tokens: Sequence[TokenWrite], *,
           maxlen: int) -> Call[AppendResult]:
    args: list[Arg] = [attempt, maxlen]
    for t in tokens:
        args += [t.data, t.token_id, t.index, t.entry_id]
    return Call("append", [keys.job(job_id), keys.job_events(job_id)], args, _appended)


def finish(end: Ending, *, maxlen: int, ttl: int, fair: FairShare,
           now: float) -> Call[FinishResult]:
    return Call("finish", [keys.job(end.job_id), keys.job_events(end.job_id),
                           keys.job_lease(end.job_id), keys.RUNNING],
                [end.attempt, end.state, dumps(end.fields), end.event, end.data, maxlen, ttl,
                 "" if end.tokens is None else end.tokens, *fair.args(), repr(now)], _finished)


def cancel(job_id: str, *, now: float, maxlen: int, ttl: int,
           queued_only: bool = False) -> Call[Cancelled]:
    return Call("cancel", [keys.job(job_id), keys.job_events(job_id), keys.RUNNING],
                [repr(now), maxlen, ttl, "1" if queued_only else "0"], _cancelled)


def renew(job_id: str, *, worker: str, attempt: int, lease_ms: int) -> Call[bool]:
    return Call("renew_job", [keys.job_lease(job_id), keys.job(job_id)],
                [lease_value(worker, attempt), lease_ms, attempt], _flag)


def requeue(job_id: str, *, queue: str, message: str, ticket: str, now: float,
            fair: FairShare) -> Call[bool]:
    """`message` names the job (a takeover); `ticket` is its lane's, for a job that waits
    in its tenant's list."""
    return Call("requeue", [keys.job(job_id), keys.job_lease(job_id), keys.RUNNING, queue,
                            keys.KOMBU_UNACKED, keys.QUEUED],
                [message, ticket, repr(now), *fair.args()], _flag)


def hand_back(job_id: str, *, worker: str, attempt: int, queue: str,
              message: str) -> Call[bool]:
    return Call("handback", [keys.job(job_id), keys.job_lease(job_id), queue],
                [lease_value(worker, attempt), message], _flag)
