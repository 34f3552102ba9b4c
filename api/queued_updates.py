"""A queued job's position and eta, live (docs/scheduling.md, "Position and ETA"): GET
/v1/jobs/{id} fills them in, and an SSE stream re-sends a `queued` event (without an id:
it is not in the job's stream, so Last-Event-ID resumes are unchanged) when they moved by
more than a step (shared/eta.py Estimate.moved), at most once a second, while the job
waits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from tokenq.api.deps import AppState
from tokenq.api.sse import next_due
from tokenq.shared import eta, keys
from tokenq.shared.catalogue import CATALOGUE, CatalogueEntry
from tokenq.shared.jobs import dumps
from tokenq.shared.schemas import JobRecord
from tokenq.shared.store import fair_share

Entry = tuple[str | None, str, str]  # (entry id or None, event, data)


async def fill(state: AppState, rec: JobRecord) -> JobRecord:
    """A queued job's record with its estimate; its reason `loading` while a worker loads
    its model (the catalogue entry's `loading_since`, as its `queued` events say)."""
    if rec.status == "queued":
        est = await eta.estimate(state.redis, rec.id, fair_share(state.settings))
        if est is not None:
            rec.position, rec.eta_s, rec.reason = est.position, est.eta_s, est.reason
            if await _loading(state, rec.model):
                rec.reason = "loading"
    return rec


async def _loading(state: AppState, model: str) -> bool:
    raw = await state.redis.hget(CATALOGUE, model)
    if not raw:
        return False
    try:
        return CatalogueEntry.model_validate_json(raw).state(0) == "loading"
    except ValueError:
        return False


async def with_updates(state: AppState, job_id: str, events: AsyncIterator[Entry],
                       every_s: float = eta.UPDATE_EVERY_S) -> AsyncIterator[Entry]:
    """`events`, with `queued` updates between them while the job waits."""
    last: eta.Estimate | None = None
    waiting = True  # until an event says it started (a preempted job waits again)
    reason = "waiting"
    model: str | None = None
    it = aiter(events)
    nxt: asyncio.Task[Any] | None = None
    due = float("-inf")  # the next update's time (the loop's clock)
    try:
        while True:
            if not waiting and nxt is None:
                # Running: no timer to race, so no task and no wait per token (the hot path)
                try:
                    entry = await anext(it)
                except StopAsyncIteration:
                    return
            else:
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(it))
                # on the shared grid: the process wakes once for every waiting stream
                now = asyncio.get_running_loop().time()
                if due <= now:
                    due = next_due(due, now, every_s)
                done, _ = await asyncio.wait({nxt}, timeout=due - now if waiting else None)
                if not done:
                    est = await eta.estimate(state.redis, job_id, fair_share(state.settings))
                    if est is None:
                        waiting = False
                        continue
                    # a `loading` wait stays `loading`; a job that arrived while its model
                    # was loading (its `queued` event said `waiting`) says so once it is
                    if model is None:
                        raw = await state.redis.hget(keys.job(job_id), "model") or ""
                        model = raw.decode() if isinstance(raw, bytes) else str(raw)
                    now_loading = bool(model) and await _loading(state, model)
                    est = replace(est, reason="loading" if now_loading else reason)
                    if est.moved(last):
                        last = est
                        yield None, "queued", dumps(est.data())
                    continue
                try:
                    entry = nxt.result()
                except StopAsyncIteration:
                    return
                nxt = None
            _, event, data = entry
            waiting = event == "queued"
            if waiting:  # (a `loading` event may carry no position: its reason counts)
                d = _parsed(data)
                reason = str(d.get("reason", reason))
                last = eta.of_event(d) or last
            yield entry
    finally:
        if nxt is not None and not nxt.done():
            nxt.cancel()


def _parsed(data: str) -> dict[str, Any]:
    try:
        d = json.loads(data)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}
