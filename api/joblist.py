"""GET /v1/jobs: the tenant's jobs, newest first, filtered, with OpenAI's cursor paging.

Read from the tenant's job index (a sorted set by creation time that CREATE writes).
Job records expire `result_ttl_s` after they end while the index keeps their ids, so
ids whose record is gone are dropped from the index as the listing meets them (and ids
past every retention at the tenant's next create: shared/lua/create.lua).

A filtered page reads at most `SCAN_CAP` index entries: when that many are read before
the page fills, the page comes back short with `has_more: true`, and its `last_id` (the
last entry read, which may not be in `data`) is the cursor for the next page.
"""

from __future__ import annotations

from typing import Any

from tokenq.api.deps import AppState
from tokenq.api.errors import InvalidRequest
from tokenq.shared import keys
from tokenq.shared.schemas import TERMINAL_STATES, JobRecord

STATES = frozenset({"queued", "running", *TERMINAL_STATES})
CHUNK = 100
SCAN_CAP = 5000


def matches(h: dict[str, str], state: str | None, model: str | None,
            metadata: dict[str, str]) -> bool:
    if state is not None and h.get("state") != state:
        return False
    if model is not None and model not in (h.get("model"), h.get("adapter")):
        return False
    if metadata:
        rec = JobRecord.from_hash(h).metadata or {}
        return all(rec.get(k) == v for k, v in metadata.items())
    return True


async def start_after(r: Any, index: str, after: str | None, noun: str) -> int:
    """The rank (newest first) where a page after `after` begins in a tenant's index; an
    `after` not in it is a 400, as OpenAI's lists answer."""
    if after is None:
        return 0
    rank: int | None = await r.zrevrank(index, after)
    if rank is None:
        raise InvalidRequest(f"after: no {noun} {after!r} in this list", param="after")
    return rank + 1


async def listing(st: AppState, tenant: str, *, limit: int, after: str | None,
                  state: str | None, model: str | None,
                  metadata: dict[str, str]) -> dict[str, Any]:
    if state is not None and state not in STATES:
        raise InvalidRequest(f"status must be one of {', '.join(sorted(STATES))}",
                             param="status")
    index = keys.tenant_jobs(tenant)
    start = await start_after(st.redis, index, after, "job")
    out: list[JobRecord] = []
    gone: list[str] = []
    scanned, exhausted = 0, False
    cursor: str | None = None
    while len(out) <= limit and scanned < SCAN_CAP:
        ids: list[str] = await st.redis.zrevrange(  # type: ignore[assignment]
            index, start, start + CHUNK - 1)
        if not ids:
            exhausted = True
            break
        start += len(ids)
        pipe = st.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
        for job_id, h in zip(ids, await pipe.execute(), strict=True):
            if not h:
                gone.append(job_id)
                continue
            if h.get("owner") == tenant and matches(h, state, model, metadata):
                out.append(JobRecord.from_hash(h))
                if len(out) > limit:
                    break
            scanned += 1
            cursor = job_id
    if gone:
        await st.redis.zrem(index, *gone)
    data = out[:limit]
    last_id: str | None
    if len(out) > limit:
        has_more, last_id = True, data[-1].id
    elif not exhausted and scanned >= SCAN_CAP:
        has_more, last_id = True, cursor
    else:
        has_more, last_id = False, data[-1].id if data else None
    return {"object": "list", "data": [r.model_dump() for r in data],
            "first_id": data[0].id if data else None, "last_id": last_id,
            "has_more": has_more}


def metadata_filter(query: list[tuple[str, str]]) -> dict[str, str]:
    """`metadata[key]=value` query parameters (Stripe's form) -> {key: value}."""
    out = {}
    for k, v in query:
        if k.startswith("metadata[") and k.endswith("]") and len(k) > len("metadata[]"):
            out[k[len("metadata["):-1]] = v
    return out
