"""The job store: the job scripts (shared/jobs.py) behind typed methods, sync and asyncio.

`JobStore` runs on a sync client (worker threads; tests); `AsyncJobStore` on a
`redis.asyncio` client (the API). Both read stream length, TTLs and lease timing from
the settings they are built with; callers pass only what the job needs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis

from tokenq.shared import jobs, keys, moves, preemption
from tokenq.shared.celery_app import ticket_mark
from tokenq.shared.jobs import (
    AcquireResult,
    AppendResult,
    Call,
    Cancelled,
    CreateResult,
    Ended,
    Ending,
    FairShare,
    FinishResult,
    IdemKey,
    NewJob,
    NewRejection,
    PickResult,
    TokenWrite,
)
from tokenq.shared.lua_scripts import Scripts, raise_first_error, refused
from tokenq.shared.moves import MoveResult
from tokenq.shared.schemas import JobErrorInfo
from tokenq.shared.settings import Settings

T = TypeVar("T")


def fair_share(s: Settings) -> FairShare:
    """How the settings order a lane's tenants (the API and the workers must agree)."""
    return FairShare(half_s=s.fair_share_window_s / 2, fifo=not s.fair_share)


def index_horizon_s(s: Settings) -> float:
    """How old an id in a tenant's job index can be while its record may still exist: a
    batch line ends within its 24 h window and lives `file_ttl_s` more, a job
    `result_ttl_s`; a day of margin (a job queued longer drops out of the list only)."""
    return max(s.result_ttl_s, s.api.file_ttl_s) + 2 * 86400


def _create(s: Settings, job_id: str, fields: dict[str, str], tenant: str, queue: str,
            message: str, queue_limit: int | None, tenant_limit: int,
            now: float | None, idem: IdemKey | None) -> Call[CreateResult]:
    return jobs.create(job_id, fields, tenant=tenant, queue=queue, message=message,
                       queue_limit=s.api.queue_limit if queue_limit is None else queue_limit,
                       tenant_limit=tenant_limit, maxlen=s.stream_maxlen,
                       now=time.time() if now is None else now, idem=idem,
                       fair=fair_share(s), index_horizon_s=index_horizon_s(s))


def _cancel(s: Settings, job_id: str, ttl: int | None,
            queued_only: bool = False) -> Call[Cancelled]:
    return jobs.cancel(job_id, now=time.time(), maxlen=s.stream_maxlen,
                       ttl=s.result_ttl_s if ttl is None else ttl, queued_only=queued_only)


def _queued(scripts: Scripts, r: Any, calls: Sequence[Call[Any]]) -> Any:
    """A pipeline on `r` (not a transaction) with each call's EVALSHA queued
    (Scripts.queue: execute it with raise_on_error=False)."""
    pipe = r.pipeline(transaction=False)
    for call in calls:
        scripts.queue(pipe, call.script, call.keys, call.args)
    return pipe


class JobStore:
    """Sync: a worker's transitions (acquire, token steps, finish, leases, rescue)."""

    def __init__(self, r: redis.Redis, settings: Settings):
        self.r = r
        self.s = settings
        self._scripts = Scripts(r)

    def _run(self, call: Call[T]) -> T:
        return call.decode(self._scripts[call.script](keys=call.keys, args=call.args))

    def _pipelined(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """Run the calls in one round trip; their raw answers, in order."""
        got: list[Any] = _queued(self._scripts, self.r, calls).execute(raise_on_error=False)
        if again := refused(got):  # never ran: load their scripts, then once more, in order
            for name in {calls[i].script for i in again}:
                self._scripts.load(name)
            retry = _queued(self._scripts, self.r, [calls[i] for i in again])
            retried = retry.execute(raise_on_error=False)
            for i, x in zip(again, retried, strict=True):
                got[i] = x
        raise_first_error(got)
        return got

    def create(self, job_id: str, fields: dict[str, str], *, tenant: str, queue: str,
               message: str, queue_limit: int | None = None, tenant_limit: int = 0,
               now: float | None = None, idem: IdemKey | None = None) -> CreateResult:
        return self._run(_create(self.s, job_id, fields, tenant, queue, message, queue_limit,
                                 tenant_limit, now, idem))

    def cancel(self, job_id: str, ttl: int | None = None) -> Cancelled:
        return self._run(_cancel(self.s, job_id, ttl))

    def acquire(self, job_id: str, worker: str) -> AcquireResult:
        s = self.s
        return self._run(jobs.acquire(job_id, worker=worker,
                                      lease_ms=int(s.worker.lease_ttl_s * 1000),
                                      max_attempts=s.worker.max_attempts, now=time.time(),
                                      maxlen=s.stream_maxlen, ttl=s.result_ttl_s))

    def pick(self, queue: str, worker: str, *, direct: bool = False,
             above: Sequence[str] = ()) -> PickResult:
        """A ticket of `queue` delivered: take the lane's next job (fair share) and lease it.
        `direct`: no ticket was delivered; take the one at the queue's consuming end too
        (NoJob('no_ticket') when a message naming a job is there instead, or the queues
        `above`, higher lanes, hold any)."""
        s = self.s
        return self._run(jobs.pick(queue, worker=worker,
                                   lease_ms=int(s.worker.lease_ttl_s * 1000),
                                   max_attempts=s.worker.max_attempts, now=time.time(),
                                   maxlen=s.stream_maxlen, ttl=s.result_ttl_s,
                                   fair=fair_share(s),
                                   ticket_mark=ticket_mark(queue) if direct else "",
                                   above=above if direct else ()))

    def finish(self, end: Ending) -> bool:
        """True if this ended the job."""
        got = self._run(jobs.finish(end, maxlen=self.s.stream_maxlen, ttl=self.s.result_ttl_s,
                                    fair=fair_share(self.s), now=time.time()))
        return got.status is Ended.ENDED

    def write_step(self, tokens: Mapping[tuple[str, int], Sequence[TokenWrite]],
                   endings: Sequence[Ending]) -> tuple[list[AppendResult], list[FinishResult]]:
        """One round trip for an engine step: every job's (job id, attempt) tokens, then
        every ending. Each write is fenced by its attempt on its own; the answers say where
        each stream really ends (workers/publisher.py re-sends what a failover lost)."""
        s = self.s
        appends = [jobs.append(job_id, attempt, toks, maxlen=s.stream_maxlen)
                   for (job_id, attempt), toks in tokens.items()]
        fair, now = fair_share(s), time.time()
        finishes = [jobs.finish(e, maxlen=s.stream_maxlen, ttl=s.result_ttl_s, fair=fair, now=now)
                    for e in endings]
        got = self._pipelined([*appends, *finishes])
        return ([c.decode(x) for c, x in zip(appends, got[:len(appends)], strict=True)],
                [c.decode(x) for c, x in zip(finishes, got[len(appends):], strict=True)])

    def renew(self, leases: Sequence[tuple[str, int]], worker: str) -> list[bool]:
        """Renew (or take back) the leases of (job id, attempt): True where still held."""
        ms = int(self.s.worker.lease_ttl_s * 1000)
        calls = [jobs.renew(job_id, worker=worker, attempt=attempt, lease_ms=ms)
                 for job_id, attempt in leases]
        return [c.decode(x) for c, x in zip(calls, self._pipelined(calls), strict=True)]

    def mark_grammar(self, job_id: str, attempt: int) -> None:
        """This attempt is compiling the job's grammar (workers/tasks.guard_grammar)."""
        self.r.hset(keys.job(job_id), "grammar_probe", str(attempt))

    def clear_grammar(self, job_id: str) -> None:
        self.r.hdel(keys.job(job_id), "grammar_probe")

    def requeue(self, job_id: str, queue: str, message: str, ticket: str = "") -> bool:
        """Rescue: `message` names the job, `ticket` is its lane's (requeue.lua)."""
        return self._run(jobs.requeue(job_id, queue=queue, message=message, ticket=ticket,
                                      now=time.time(), fair=fair_share(self.s)))

    def hand_back(self, job_id: str, worker: str, attempt: int, queue: str,
                  message: str) -> bool:
        return self._run(jobs.hand_back(job_id, worker=worker, attempt=attempt, queue=queue,
                                        message=message))

    def preempt(self, job_id: str, worker: str, attempt: int, queue: str,
                message: str, ticket: str = "") -> bool:
        """Back to `queued` (tokens kept) for a waiting higher-priority job, or with the
        lane's `ticket` for a tenant served far less (preempt.lua): True if it was."""
        return self._run(preemption.preempt(
            job_id, worker=worker, attempt=attempt, queue=queue, message=message,
            now=time.time(), maxlen=self.s.stream_maxlen, ticket=ticket,
            fair=fair_share(self.s)))

    def fair_victims(self, queue: str, running: Sequence[str],
                     claim_ms: int) -> tuple[str, str | None]:
        """Which of `running` (in the order to choose from) to hand back to the lane's
        next tenant (fair_victims.lua: 'ok', 'claimed', 'none' or 'alone'); ('none', None)
        under FIFO."""
        if not self.s.fair_share or not running:
            return "none", None
        return self._run(preemption.fair_victims(queue, running, claim_ms=claim_ms,
                                                 now=time.time(), fair=fair_share(self.s)))


    def move(self, expected: str, *, from_queue: str, to_queue: str, from_pool: str,
             to_pool: str, to_backend: str, ticket: str) -> MoveResult:
        """The `from_queue` lane's next job (if still `expected`) into another pool's lane of
        the same model and priority (move.lua)."""
        return self._run(moves.move(expected, from_queue=from_queue, to_queue=to_queue,
                                    from_pool=from_pool, to_pool=to_pool,
                                    to_backend=to_backend, ticket=ticket, now=time.time(),
                                    fair=fair_share(self.s)))


class AsyncJobStore:
    """asyncio: the API's transitions (create, cancel)."""

    def __init__(self, r: aioredis.Redis, settings: Settings):
        self.r = r
        self.s = settings
        self._scripts = Scripts(r)

    async def _run(self, call: Call[T]) -> T:
        return call.decode(await self._scripts[call.script](keys=call.keys, args=call.args))

    async def create(self, job_id: str, fields: dict[str, str], *, tenant: str, queue: str,
                     message: str, queue_limit: int | None = None, tenant_limit: int = 0,
                     now: float | None = None,
                     idem: IdemKey | None = None) -> CreateResult:
        return await self._run(_create(self.s, job_id, fields, tenant, queue, message,
                                       queue_limit, tenant_limit, now, idem))

    async def create_acked(self, job_id: str, fields: dict[str, str], *, tenant: str,
                           queue: str, message: str, replicas: int, timeout_ms: int,
                           queue_limit: int | None = None, tenant_limit: int = 0,
                           now: float | None = None,
                           idem: IdemKey | None = None) -> tuple[CreateResult, int]:
        """`create`, then Redis WAIT for `replicas` (at most `timeout_ms`) in the same round
        trip and on the same connection (WAIT counts the replicas that have this
        connection's writes): what the store answered, and how many replicas have it."""
        call = _create(self.s, job_id, fields, tenant, queue, message, queue_limit,
                       tenant_limit, now, idem)
        for _ in range(2):
            pipe = _queued(self._scripts, self.r, [call])
            pipe.wait(replicas, timeout_ms)
            raw, acked = await pipe.execute(raise_on_error=False)
            if not refused([raw]):
                break
            await self._scripts.load(call.script)  # the create never ran: once more
        raise_first_error([raw, acked])
        return call.decode(raw), int(acked)

    async def create_many(self, lines: Sequence[NewJob | NewRejection]
                          ) -> list[CreateResult | bool]:
        """Each line's `create` (a `NewJob`: its CreateResult) or `reject` (a `NewRejection`:
        True if it wrote the record, False if the id existed), in order, in one pipelined
        round trip. Not a transaction: each script is atomic on its own and other clients'
        commands may run between them, so a refusal (QueueFull) does not stop the lines
        after it; callers that need order stop at the first refusal (the ids make the
        lines after it idempotent when they are sent again)."""
        s = self.s
        calls: list[Call[Any]] = [
            _create(s, x.job_id, x.fields, x.tenant, x.queue, x.message, x.queue_limit,
                    x.tenant_limit, x.now, None) if isinstance(x, NewJob)
            else jobs.reject(x.job_id, x.fields, tenant=x.tenant, error=x.error, now=x.now,
                             maxlen=s.stream_maxlen, ttl=x.ttl, state=x.state)
            for x in lines]
        if not calls:
            return []
        got: list[Any] = await _queued(self._scripts, self.r, calls).execute(raise_on_error=False)
        if again := refused(got):  # never ran: load their scripts, then once more, in order
            for name in {calls[i].script for i in again}:
                await self._scripts.load(name)
            retry = _queued(self._scripts, self.r, [calls[i] for i in again])
            retried = await retry.execute(raise_on_error=False)
            for i, x in zip(again, retried, strict=True):
                got[i] = x
        raise_first_error(got)
        return [c.decode(x) for c, x in zip(calls, got, strict=True)]

    async def wait_replicated(self, replicas: int, timeout_ms: int) -> int:
        """How many replicas (WAIT, at most `timeout_ms`) have every write the primary made
        before now, whichever connection made it: a PUBLISH (a write that replicates) then
        WAIT on the same connection."""
        pipe = self.r.pipeline(transaction=False)
        pipe.publish(keys.DURABLE_BARRIER, "")
        pipe.wait(replicas, timeout_ms)
        _, acked = await pipe.execute()
        return int(acked)

    async def cancel(self, job_id: str, ttl: int | None = None, *,
                     queued_only: bool = False) -> Cancelled:
        """`queued_only` (a batch's cancel): a running job is left to finish."""
        return await self._run(_cancel(self.s, job_id, ttl, queued_only))

    async def reject(self, job_id: str, fields: dict[str, str], *, tenant: str,
                     error: JobErrorInfo, ttl: int) -> bool:
        return await self._run(jobs.reject(job_id, fields, tenant=tenant, error=error,
                                           now=time.time(), maxlen=self.s.stream_maxlen,
                                           ttl=ttl))
