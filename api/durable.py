"""Durable acceptance: a 202 only once the job is on enough Redis replicas.

Redis replicates asynchronously. A job written on the primary and answered 202 is lost if
the primary dies before its replica has it and Sentinel promotes that replica. With
``TOKENQ_API__DURABLE_REPLICAS=n`` the API sends Redis WAIT right after the create script,
in the same round trip and on the same connection, and answers 202 only once `n` replicas
acknowledged the write.

Fewer within ``TOKENQ_API__DURABLE_TIMEOUT_MS``: 503 ``not_replicated`` (retryable). The
job does exist on the primary then (WAIT cannot undo a write), and may reach the replica
later or be lost with the primary:
- with an Idempotency-Key it is kept, and the message names it (GET /v1/jobs/{id} tells
  whether it survived). A retry with the same key answers this very job, and only once it
  is on enough replicas (`check_replay`): else another 503 naming it;
- without one it is cancelled at once, so the client's retry does not run the request a
  second time (and a replica outage does not turn every retried POST into a job that runs
  unseen). A cancel that cannot be written leaves it queued: at-least-once, never lost
  silently after a 202.

The end of a job is held the same way (`settle_terminal`): before a client reads a
terminal event or a terminal record through this API, the replicas are given up to
``TOKENQ_API__DURABLE_TIMEOUT_MS`` to have it. Without that, a `done` read from the primary
an instant before it died could be taken back: the promoted replica never had the ending,
the job runs again from its stream's tokens, and a sampled job ends with other text than
the client was shown. Short: the event is passed on anyway (logged), as holding a stream
for good would be worse.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import RedisError

from tokenq.api.deps import AppState
from tokenq.api.errors import NotReplicated
from tokenq.shared import jobs

log = logging.getLogger("tokenq.jobs")


async def create(state: AppState, job_id: str, fields: dict[str, str], *, tenant: str,
                 queue: str, message: str, queue_limit: int | None, tenant_limit: int,
                 now: float, idem: jobs.IdemKey | None,
                 durable: bool) -> jobs.CreateResult:
    """The store's create; with `durable` and durable_replicas set, followed by WAIT (see
    the module docstring for what a short answer does)."""
    need = state.settings.api.durable_replicas if durable else 0
    if not need:
        return await state.jobs.create(job_id, fields, tenant=tenant, queue=queue,
                                       message=message, queue_limit=queue_limit,
                                       tenant_limit=tenant_limit, now=now, idem=idem)
    timeout_ms = state.settings.api.durable_timeout_ms
    created, acked = await state.jobs.create_acked(
        job_id, fields, tenant=tenant, queue=queue, message=message, replicas=need,
        timeout_ms=timeout_ms, queue_limit=queue_limit, tenant_limit=tenant_limit, now=now,
        idem=idem)
    if isinstance(created, jobs.Replayed):
        # The create wrote nothing: WAIT said nothing about the key's job.
        await check_replay(state, created.job_id)
    if not isinstance(created, jobs.Created) or acked >= need:
        return created
    short = (f"{acked} of {need} Redis replicas acknowledged the job within {timeout_ms} ms, "
             "so a Redis failover could lose it")
    if idem is not None:
        log.warning("job %s: not replicated (%d/%d); kept for its Idempotency-Key",
                    job_id, acked, need, extra={"job_id": job_id})
        raise NotReplicated(f"{short}: job {job_id} is kept; retry with the same "
                            "Idempotency-Key to get it back, or GET /v1/jobs/" + job_id)
    cancelled = False
    with contextlib.suppress(RedisError):
        await state.jobs.cancel(job_id)
        cancelled = True
    log.warning("job %s: not replicated (%d/%d); %s", job_id, acked, need,
                "cancelled" if cancelled else "could not be cancelled",
                extra={"job_id": job_id})
    raise NotReplicated(f"{short}: it was {'cancelled' if cancelled else 'not confirmed'}; "
                        "retry")


async def check_replay(state: AppState, job_id: str) -> None:
    """An Idempotency-Key's earlier job, answered again: a 202 for it means the same as for
    a new one. Its write (by another request, maybe answered 503 `not_replicated`) is
    covered by a WAIT after a barrier write (AsyncJobStore.wait_replicated)."""
    short = await _short_of_replicas(state)
    if short is not None:
        acked, need, timeout_ms = short
        raise NotReplicated(f"{acked} of {need} Redis replicas acknowledged within "
                            f"{timeout_ms} ms, so a Redis failover could lose job {job_id}; "
                            "retry with the same Idempotency-Key, or GET /v1/jobs/" + job_id)


async def settle_terminal(state: AppState, what: str) -> None:
    """A terminal event or record is about to reach a client: with durable_replicas set,
    wait (bounded) until that many replicas have every write made so far, the ending
    included (see the module docstring)."""
    try:
        short = await _short_of_replicas(state)
    except RedisError as exc:
        log.warning("%s: could not check replication (%s); passed on", what, exc)
        return
    if short is not None:
        acked, need, timeout_ms = short
        log.warning("%s: on %d of %d replicas after %d ms; passed on", what, acked, need,
                    timeout_ms)


async def _short_of_replicas(state: AppState) -> tuple[int, int, int] | None:
    """None when enough replicas hold every write made so far (or none are asked for);
    else (replicas that acknowledged, replicas asked for, the wait in ms)."""
    need = state.settings.api.durable_replicas
    if not need:
        return None
    timeout_ms = state.settings.api.durable_timeout_ms
    acked = await state.jobs.wait_replicated(need, timeout_ms)
    return None if acked >= need else (acked, need, timeout_ms)


async def confirm(state: AppState, what: str,
                  undo: Callable[[], Awaitable[object]] | None = None) -> None:
    """A file or a batch is answered only once it is on enough replicas, like a job (the
    same settings): a WAIT after a barrier write covers every write made before it.
    Short: `undo` (the upload deleted, the batch cancelled, so a retry does not leave a
    twin behind), then a retryable 503 `not_replicated`."""
    short = await _short_of_replicas(state)
    if short is None:
        return
    acked, need, timeout_ms = short
    undone = False
    if undo is not None:
        with contextlib.suppress(RedisError):
            await undo()
            undone = True
    log.warning("%s: not replicated (%d/%d)%s", what, acked, need,
                "; withdrawn" if undone else "")
    raise NotReplicated(f"{acked} of {need} Redis replicas acknowledged {what} within "
                        f"{timeout_ms} ms, so a Redis failover could lose it: "
                        f"{'it was withdrawn' if undone else 'it is not confirmed'}; retry")
