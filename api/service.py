"""Job logic behind the routes: validate, enqueue, read, cancel, stream.

Where a job is enqueued: `submit` -> `enqueue` -> the job store's `create`
(shared/lua/create.lua), which writes the record, the Celery message and the `queued`
event in one atomic step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from tokenq.api import durable, idempotency, ids, placement, stream_ids
from tokenq.api.admission import Prepared, new_job_id, prepare
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    Draining,
    NotFound,
    QueueFull,
)
from tokenq.api.idempotency import Idem
from tokenq.shared import jobs, keys, logs, tracing
from tokenq.shared.celery_app import ticket_message
from tokenq.shared.schemas import (
    TERMINAL_STATES,
    JobAccepted,
    JobRecord,
    JobRequest,
    WorkerHeartbeat,
)

log = logging.getLogger("tokenq.jobs")


def new_job(state: AppState, tenant: str, p: Prepared, *, job_id: str | None = None,
            deadline: float | None = None, extra: dict[str, str] | None = None) -> jobs.NewJob:
    """A prepared request as the store creates it: its record's fields, its queue and its
    Celery message (`enqueue`; the batch driver, a chunk of lines at a time)."""
    job_id = job_id or new_job_id()
    now = time.time()
    # fair share (docs/scheduling.md): its tenant's weight, and the charge when it is taken
    fields = {**p.fields, "id": job_id, "created_at": repr(now), "weight": repr(weight_of(
        state, tenant)), "est_tokens": str(p.n_prompt + p.max_tokens), **(extra or {})}
    if deadline is not None:
        fields["deadline"] = repr(deadline)
    queue = keys.queue(p.pool or p.model, p.priority)
    return jobs.NewJob(job_id, fields, tenant, queue, ticket_message(state.celery, queue), now)


async def place(state: AppState, p: Prepared,
                beats: list[WorkerHeartbeat] | None = None) -> None:
    """Choose the pool a prepared job waits in (a model served by several; a first-token
    budget): api/placement.py. Its create must follow, or `placement.release`."""
    cfg = state.models.get(p.model)
    if cfg is not None and p.fields.get("model"):
        p.pool = await placement.place(
            state, p.model, cfg, p.fields, priority=p.priority, n_prompt=p.n_prompt,
            max_tokens=p.max_tokens, pin=p.pin, budget_ms=p.budget_ms, beats=beats)


def weight_of(state: AppState, tenant: str) -> float:
    """The tenant's fair-share weight: its key entries' (api/auth.py checks they agree)."""
    return next((p.weight for p in state.api_keys.values() if p.tenant == tenant), 1.0)


async def enqueue(state: AppState, tenant: str, p: Prepared, *, job_id: str | None = None,
                  deadline: float | None = None, extra: dict[str, str] | None = None,
                  queue_limit: int | None = None, tenant_limit: int = 0, idem: Idem | None = None,
                  acked: bool = False) -> tuple[jobs.CreateResult, str, float]:
    """Record + Celery message + `queued` event in one atomic step: (what the store
    answered, the job id, its created_at). With an Idempotency-Key the store may answer
    with the key's earlier job (`Replayed`, `KeyReused`): the id returned is then that
    job's. `acked`: a client waits for this answer: durable acceptance (api/durable.py)."""
    idem_key = None if idem is None else jobs.IdemKey(idem.redis_key, idem.body_sha,
                                                      state.settings.api.idempotency_ttl_s)
    cfg = state.models.get(p.model)
    ordered = placement.in_order(state, p.model, cfg)
    # the heartbeats read before the lock: its holder makes only the two script calls
    beats = None if ordered is placement.UNORDERED else list(
        (await state.live_workers()).values())
    async with ordered:
        await place(state, p, beats)
        job = new_job(state, tenant, p, job_id=job_id, deadline=deadline, extra=extra)
        try:
            created = await durable.create(state, job.job_id, job.fields, tenant=tenant,
                                           queue=job.queue, message=job.message,
                                           queue_limit=queue_limit, tenant_limit=tenant_limit,
                                           now=job.now, idem=idem_key, durable=acked)
        except BaseException:
            if p.fields.get("pool"):  # not created (or not known to be): counted no longer
                await asyncio.shield(placement.release(state, p.fields["pool"]))
            raise
    if p.fields.get("pool") and not isinstance(created, jobs.Created):
        await placement.release(state, p.fields["pool"])
    if isinstance(created, jobs.Replayed | jobs.KeyReused):
        return created, created.job_id, job.now
    return created, job.job_id, job.now


async def submit(state: AppState, tenant: str, req: JobRequest, *,
                 deadline: float | None = None,
                 extra: dict[str, str] | None = None) -> JobAccepted:
    """Validate and enqueue one request (native jobs and OpenAI chat/completions)."""
    accepted, _ = await submit_once(state, tenant, req, None, deadline=deadline, extra=extra)
    return accepted


async def replayed(state: AppState, job_id: str, req: JobRequest) -> JobAccepted | None:
    """The accepted answer of the Idempotency-Key's job, as it stands now (None: gone)."""
    st, created = await state.redis.hmget(keys.job(job_id), ["state", "created_at"])
    if st is None or created is None:
        return None
    return JobAccepted(id=job_id, model=req.model, status=str(st),  # type: ignore[arg-type]
                       created_at=float(created),
                       stream_url=f"/v1/jobs/{job_id}/events")


async def submit_once(state: AppState, tenant: str, req: JobRequest, idem: Idem | None, *,
                      deadline: float | None = None,
                      extra: dict[str, str] | None = None) -> tuple[JobAccepted, bool]:
    """`submit`, with an Idempotency-Key: (the job, whether it is a replay of an earlier
    request). A replay is answered before validation and rate charges."""
    if idem is not None:
        stored: str | None = await state.redis.get(idem.redis_key)  # type: ignore[assignment]
        if stored is not None:
            job_id, sha = idempotency.split(stored)
            idempotency.check_same_body(idem, sha)
            again = await replayed(state, job_id, req)
            if again is not None:
                await durable.check_replay(state, job_id)
                return again, True
    if state.draining:
        raise Draining("this API replica is shutting down; retry (another replica will serve)")
    with tracing.span("job.submit", **{"tokenq.tenant": tenant, "tokenq.model": req.model}
                      ) as sp, logs.bind(model=req.model):
        accepted = await _submit(state, tenant, req, idem, deadline, extra)
        if sp is not None:
            sp.set_attribute("tokenq.job_id", accepted[0].id)
        log.info("job %s: queued", accepted[0].id, extra={"job_id": accepted[0].id})
        return accepted


async def _submit(state: AppState, tenant: str, req: JobRequest, idem: Idem | None,
                  deadline: float | None,
                  extra: dict[str, str] | None) -> tuple[JobAccepted, bool]:
    p = await prepare(state, tenant, req)
    parent = tracing.traceparent()
    if parent is not None:
        p.fields["traceparent"] = parent
    await state.limits.charge_tokens(tenant, state.settings.api.tokens_per_min,
                                     p.n_prompt + p.max_tokens)
    deadline = deadline if deadline is not None else req.deadline
    created, job_id, now = await enqueue(state, tenant, p, deadline=deadline, extra=extra,
                                         tenant_limit=state.settings.api.tenant_max_queued,
                                         idem=idem, acked=True)
    if isinstance(created, jobs.KeyReused):
        raise idempotency.key_reused()
    if isinstance(created, jobs.Replayed):
        again = await replayed(state, job_id, req)
        if again is not None:
            return again, True
    if isinstance(created, jobs.TenantFull):
        raise QueueFull(f"you have {state.settings.api.tenant_max_queued} jobs queued, the limit "
                        "per tenant; retry when some have started", retry_after=5,
                        code="tenant_queue_full")
    if not isinstance(created, jobs.Created):
        depth = await state.redis.llen(keys.queue(p.pool or p.model, p.priority))
        raise QueueFull(f"the queue for {req.model!r} is full ({depth} jobs); retry later",
                        retry_after=max(1, min(60, int(depth) // 100)))
    return JobAccepted(id=job_id, model=req.model, created_at=now,
                       stream_url=f"/v1/jobs/{job_id}/events", position=created.position,
                       eta_s=created.eta_s), False


async def get(state: AppState, tenant: str, job_id: str) -> JobRecord:
    ids.check("job", job_id, "job_id")
    h: dict[str, str] = await state.redis.hgetall(keys.job(job_id))  # type: ignore[assignment]
    # Another tenant's job is indistinguishable from a missing one.
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no job {job_id!r}", param="job_id")
    if h.get("state") in TERMINAL_STATES and state.settings.api.durable_replicas:
        await durable.settle_terminal(state, f"job {job_id}")
    return JobRecord.from_hash(h)


async def check_owner(state: AppState, tenant: str, job_id: str) -> None:
    """404 unless the job exists and is the tenant's: one field, not the whole record (which
    holds the prompt twice and the output)."""
    ids.check("job", job_id, "job_id")
    if await state.redis.hget(keys.job(job_id), "owner") != tenant:
        raise NotFound(f"no job {job_id!r}", param="job_id")


async def cancel(state: AppState, tenant: str, job_id: str, wait_s: float = 2.0) -> JobRecord:
    """Cancel; idempotent. Waits briefly for a running job's engine to let go."""
    await check_owner(state, tenant, job_id)
    if await state.jobs.cancel(job_id) is jobs.Cancelled.REQUESTED:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await state.redis.hget(keys.job(job_id), "state") != "running":
                break
            await asyncio.sleep(0.05)
    return await get(state, tenant, job_id)


async def resume_point(state: AppState, job_id: str, after: str) -> str | None:
    """Where a resume with Last-Event-ID `after` starts (api/stream_ids.py)."""
    return await stream_ids.resume_point(state.redis, keys.job_events(job_id), after)


async def events(state: AppState, job_id: str,
                 after: str | None) -> AsyncIterator[tuple[str, str, str]]:
    """(id, event, data JSON) for each stream entry after `after`, to the terminal event.
    The data is relayed as the worker wrote it: no parse and re-encode per token."""
    async for entry_id, fields in state.hub.subscribe(keys.job_events(job_id), after):
        yield entry_id, fields["e"], fields["d"]
