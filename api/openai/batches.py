"""OpenAI Batches: a batch is a Redis hash; each input line becomes a `low` priority job.

Life of a batch (OpenAI's statuses):

    validating   the driver (api/openai/batch_driver.py) checks every line first;
                 any bad line -> `failed` with per-line errors, nothing enqueued
    in_progress  the driver enqueues lines in chunks (cursor in the hash, so another
                 API replica continues after a crash); lines run as ordinary jobs
    completed    set by the job scripts when the last line ends (shared/jobs.py):
    | expired    counting happens in the same atomic step as the job's own end,
                 so a batch can neither miss a line nor count one twice
    cancelling   queued lines are cancelled; running ones finish
    -> cancelled

Output and error files are registered when the batch settles and rendered on read
(api/openai/batch_files.py).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from redis.exceptions import WatchError

from tokenq.api import admission, idempotency, ids
from tokenq.api.deps import AppState
from tokenq.api.errors import Conflict, IdempotencyInProgress, InvalidRequest, NotFound
from tokenq.api.idempotency import Idem
from tokenq.api.joblist import start_after
from tokenq.api.openai import batch_files, files
from tokenq.api.openai.batch_files import TERMINAL
from tokenq.api.openai.batch_store import BatchStore
from tokenq.api.openai.protocol import ENDPOINTS
from tokenq.shared import keys
from tokenq.shared.jobs import dumps
from tokenq.shared.store import index_horizon_s

WINDOWS = {"24h": 24 * 3600}
_TIMES = ("in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
          "expired_at", "cancelling_at", "cancelled_at")


def _int(v: str | None) -> int | None:
    return int(float(v)) if v else None


def batch_object(h: dict[str, str]) -> dict[str, Any]:
    done = h["status"] in TERMINAL
    completed, failed = int(h.get("completed", 0)), int(h.get("failed", 0))
    return {
        "id": h["id"], "object": "batch", "endpoint": h["endpoint"],
        "errors": json.loads(h["errors"]) if h.get("errors") else None,
        "input_file_id": h["input_file_id"], "completion_window": h["completion_window"],
        "status": h["status"],
        "output_file_id": h["output_file_id"] if done and completed else None,
        "error_file_id": h["error_file_id"] if done and failed else None,
        "created_at": int(float(h["created_at"])),
        **{t: _int(h.get(t)) for t in _TIMES},
        "request_counts": {"total": int(h.get("total", 0)), "completed": completed,
                           "failed": failed},
        "metadata": json.loads(h["metadata"]) if h.get("metadata") else None,
    }


async def create(state: AppState, tenant: str, input_file_id: str, endpoint: str,
                 completion_window: str, metadata: dict[str, str] | None,
                 idem: Idem | None = None) -> tuple[dict[str, Any], bool]:
    """(the batch, whether it is the Idempotency-Key's earlier one)."""
    if idem is not None:
        earlier = await _replay(state, tenant, idem)
        if earlier is not None:
            return earlier, True
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}",
                             param="endpoint")
    if completion_window not in WINDOWS:
        raise InvalidRequest("completion_window must be '24h'", param="completion_window")
    try:
        f = await files.meta(state, tenant, input_file_id)
    except NotFound as exc:  # named as this request names it
        exc.param = "input_file_id"
        raise
    if f["purpose"] != "batch":
        raise InvalidRequest(f"file {input_file_id} has purpose {f['purpose']!r}, not 'batch'",
                             param="input_file_id")
    now = time.time()
    hex_ = uuid.uuid4().hex
    batch_id = "batch_" + hex_
    h = {"id": batch_id, "owner": tenant, "endpoint": endpoint, "input_file_id": input_file_id,
         "completion_window": completion_window, "status": "validating",
         "created_at": repr(now), "expires_at": repr(now + WINDOWS[completion_window]),
         "output_file_id": "file-" + hex_ + "o", "error_file_id": "file-" + hex_ + "e",
         "total": "0", "completed": "0", "failed": "0", "enqueued": "0", "cursor": "0",
         # where batch_settle registers the output files (shared/lua/terminal.lua)
         "files_key": keys.tenant_files(tenant), "file_ttl": str(state.settings.api.file_ttl_s)}
    if metadata:
        h["metadata"] = dumps(metadata)
        if metadata.get("webhook_url"):
            h["webhook_url"] = await admission.check_webhook_url(state, metadata["webhook_url"])
    async with state.redis.pipeline(transaction=True) as pipe:
        if idem is not None:
            # The key and the batch are written in one MULTI, which fails if another
            # request set the key after our read: that one's batch is then the answer.
            await pipe.watch(idem.redis_key)
            if await pipe.exists(idem.redis_key):
                return await _replay_or_conflict(state, tenant, idem), True
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.set(idem.redis_key, f"{batch_id}|{idem.body_sha}",
                     ex=state.settings.api.idempotency_ttl_s)
        pipe.hset(keys.batch(batch_id), mapping=h)  # type: ignore[arg-type]
        pipe.zadd(keys.tenant_batches(tenant), {batch_id: now})
        # the index keeps expired batches' ids (a client paging from one still pages on)
        # until they are past every batch's life: its window, then its files' TTL
        pipe.zremrangebyscore(keys.tenant_batches(tenant), "-inf",
                              f"({now - index_horizon_s(state.settings)}")
        pipe.sadd(keys.BATCHES_PENDING, batch_id)
        try:
            await pipe.execute()
        except WatchError:
            return await _replay_or_conflict(state, tenant, idem), True
    wake = state.background.get("batch_wake")
    if wake is not None:
        wake.set()
    return batch_object(h), False


async def _replay(state: AppState, tenant: str, idem: Idem) -> dict[str, Any] | None:
    stored: str | None = await state.redis.get(idem.redis_key)  # type: ignore[assignment]
    if stored is None:
        return None
    batch_id, sha = idempotency.split(stored)
    idempotency.check_same_body(idem, sha)
    h: dict[str, str] = await state.redis.hgetall(keys.batch(batch_id))  # type: ignore[assignment]
    return await shown(state, h) if h and h.get("owner") == tenant else None


async def _replay_or_conflict(state: AppState, tenant: str,
                              idem: Idem | None) -> dict[str, Any]:
    earlier = None if idem is None else await _replay(state, tenant, idem)
    if earlier is None:
        raise IdempotencyInProgress("a request with this Idempotency-Key is being "
                                    "processed; retry", param="Idempotency-Key")
    return earlier


async def _hash(state: AppState, tenant: str, batch_id: str) -> dict[str, str]:
    ids.check("batch", batch_id, "batch_id")
    h: dict[str, str] = await state.redis.hgetall(keys.batch(batch_id))  # type: ignore[assignment]
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no batch {batch_id!r}", param="batch_id")
    return h


async def shown(state: AppState, h: dict[str, str]) -> dict[str, Any]:
    """The batch object as every route shows it: a finished batch's file ids resolve."""
    await batch_files.ensure_registered(state, h)
    return batch_object(h)


async def get(state: AppState, tenant: str, batch_id: str) -> dict[str, Any]:
    return await shown(state, await _hash(state, tenant, batch_id))


async def listing(state: AppState, tenant: str, limit: int, after: str | None) -> dict[str, Any]:
    """Newest first; `after` must be a batch of this list (400 otherwise, as jobs)."""
    index = keys.tenant_batches(tenant)
    start = await start_after(state.redis, index, after, "batch")
    out: list[dict[str, Any]] = []
    while len(out) <= limit:  # one more than the page: has_more
        want = limit + 1 - len(out)
        ids: list[str] = await state.redis.zrevrange(  # type: ignore[assignment]
            index, start, start + want - 1)
        for batch_id in ids:
            h: dict[str, str] = await state.redis.hgetall(keys.batch(batch_id))  # type: ignore[assignment]
            if h:  # (else expired with its files: terminal.lua, expire_batch)
                out.append(await shown(state, h))
        start += len(ids)
        if len(ids) < want:
            break
    return {"object": "list", "data": out[:limit], "has_more": len(out) > limit,
            "first_id": out[0]["id"] if out else None,
            "last_id": out[min(limit, len(out)) - 1]["id"] if out else None}


async def cancel(state: AppState, tenant: str, batch_id: str) -> dict[str, Any]:
    h = await _hash(state, tenant, batch_id)
    if h["status"] in ("cancelling", "cancelled"):
        return await shown(state, h)  # a repeated cancel answers the batch, as OpenAI's
    found = await BatchStore(state.redis, "").cancel(batch_id) \
        if h["status"] in ("validating", "in_progress") else h["status"]
    if found in ("cancelling", "cancelled"):
        return await shown(state, await _hash(state, tenant, batch_id))
    if found not in ("validating", "in_progress"):  # it ended meanwhile (or had)
        raise Conflict(f"batch {batch_id} is {found} and cannot be cancelled")
    nudge = state.background.get("batch_nudge")
    if nudge is not None:
        nudge(batch_id)
    return batch_object(await _hash(state, tenant, batch_id))
