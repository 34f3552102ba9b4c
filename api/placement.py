"""Placement: which pool of a model a new job waits in (docs/scheduling.md, "Placement").

A model may be served by several pools at once (ModelConfig.pools: vLLM on GPUs beside
llama.cpp on CPUs, say), each with its own lanes (`tokenq.{model}@{pool}.{priority}`). At
submit, for each pool with a live worker, the job's finish is estimated from the pool's
load (its jobs placed and not ended, `tokenq:pool:load`) and its workers' measured pace
(heartbeats; workers/pace.py):

    wait   = 0 while the load is below the pool's slots; else it starts with the k-th
             slot to free (k = load - slots + 1), in the ceil(k / slots)-th round of
             the pool's slots, the round under way taken as half done:
             (ceil(k / slots) - 1/2) x the pool's mean job time. (A slot freeing every
             job time / slots, as in a steady stream, put the last jobs of a burst on a
             slower pool: its slots had all started together, and the first freed a whole
             job later.)
    first  = wait + prompt tokens / the pool's prompt rate
    finish = first + (max_tokens - 1) / one stream's decode rate

place.lua computes this and counts the job in the chosen pool in one atomic step, so a
burst of concurrent submits sees itself; terminal.lua counts it out when it ends. A
replica's jobs reach their lane in the order they were placed (`in_order`).

The job goes to the earliest finish, or to the pool the request pins (`backend`: a pool's
name or its backend). With `ttft_budget_ms`, a pool whose `first` is later is no
candidate, and none left is a 503 `budget_unreachable` with Retry-After. A pool whose pace
is not measured yet is taken at the mean pace of those measured (so it gets work and is
measured); with none measured, every pool alike. A job still queued may later move to a
pool that would finish it sooner (workers/rebalance.py), unless the request pinned it.

Known limits: the load counts every priority alike; the estimate uses the job's
`max_tokens`, not what it will write. A model with one pool and a budget is estimated
from its workers' running jobs as last beaten and its lanes' waiting tickets
(`check_budget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from dataclasses import dataclass
from typing import Any

from tokenq.api.deps import AppState
from tokenq.api.errors import BudgetUnreachable, InvalidRequest
from tokenq.shared import keys
from tokenq.shared.estimates import PRIOR, combined_pace, mean_pace, own_times
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.model_config import ModelConfig, pool_id
from tokenq.shared.schemas import Pace, WorkerHeartbeat
from tokenq.shared.weights import select_backend


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """One pool of a model as placement sees it."""

    name: str  # the pool's name ('' for a model's one pool)
    backend: str
    workers: int  # live workers
    slots: int
    busy: int  # running + waiting at the job's priority or higher
    pace: Pace | None  # its workers' (weighted by jobs measured)


@dataclass(frozen=True, slots=True)
class Estimate:
    pool: str
    first_s: float
    finish_s: float


def pins(cfg: ModelConfig) -> dict[str, str]:
    """What a request's `backend` may name for this model -> the pool it pins ('' for a
    model's one pool): each pool's name and each backend that only one pool has."""
    if not cfg.pools:
        return {select_backend(cfg): ""}
    backends = {n: select_backend(cfg.pool(n)) for n in cfg.pools}
    out = {b: n for n, b in backends.items() if list(backends.values()).count(b) == 1}
    return {**out, **{n: n for n in cfg.pools}}


def check_pin(model: str, cfg: ModelConfig, pin: str | None) -> str | None:
    """The pool a request's `backend` pins (400 for one this model has not)."""
    if pin is None:
        return None
    known = pins(cfg)
    if pin not in known:
        raise InvalidRequest(f"backend {pin!r}: model {model!r} is served by "
                             f"{', '.join(sorted(known))}", param="backend")
    return known[pin]


def estimate(load: PoolLoad, pace: Pace, n_prompt: int, max_tokens: int) -> Estimate:
    """The formula of the module's docstring (place.lua computes the same in Redis)."""
    slots = max(1, load.slots)
    wait = (0.0 if load.busy < slots
            else (math.ceil((load.busy - slots + 1) / slots) - 0.5) * pace.job_s)
    prompt, decode = own_times(pace, n_prompt, max_tokens)
    return Estimate(load.name, wait + prompt, wait + prompt + decode)


def choose(loads: list[PoolLoad], n_prompt: int, max_tokens: int, pin: str | None,
           budget_ms: int | None) -> tuple[str, list[Estimate]]:
    """The pool a job goes to, and the estimates it was chosen by (pools with workers)."""
    live = [ld for ld in loads if ld.workers]
    known = mean_pace([ld.pace for ld in live if ld.pace is not None]) or PRIOR
    ests = [estimate(ld, ld.pace or known, n_prompt, max_tokens) for ld in live]
    cands = [e for e in ests if pin is None or e.pool == pin]
    if budget_ms is not None:
        fits = [e for e in cands if e.first_s * 1000 <= budget_ms]
        if not fits:
            soonest = min((e.first_s for e in cands), default=None)
            raise BudgetUnreachable(
                f"no pool of this model is estimated to give the first token within "
                f"{budget_ms} ms" + (f" (the soonest: {soonest * 1000:.0f} ms)"
                                      if soonest is not None else " (no worker serves it)"),
                retry_after=max(1, math.ceil(soonest - budget_ms / 1000))
                if soonest is not None else 5)
        cands = fits
    if not cands:  # nobody serves the pinned pool (or any): it waits for a worker
        return (pin if pin is not None else loads[0].name), ests
    return min(cands, key=lambda e: e.finish_s).pool, ests


async def check_budget(state: AppState, model: str, cfg: ModelConfig, priority: str,
                       n_prompt: int, max_tokens: int, budget_ms: int) -> None:
    """A model with one pool: 503 when its first token is estimated past the budget (its
    load: the workers' running jobs as last beaten, and its lanes' waiting tickets)."""
    higher = keys.PRIORITIES[:keys.PRIORITIES.index(priority) + 1]
    async with state.redis.pipeline(transaction=False) as pipe:
        for prio in higher:
            pipe.llen(keys.queue(model, prio))
        waiting = sum(await pipe.execute())
    mine = [b for b in (await state.live_workers()).values() if (b.pool or b.model) == model]
    load = PoolLoad("", select_backend(cfg), len(mine), sum(b.slots for b in mine),
                    sum(b.running for b in mine) + waiting, combined_pace(mine))
    choose([load], n_prompt, max_tokens, None, budget_ms)


async def place(state: AppState, model: str, cfg: ModelConfig, fields: dict[str, str], *,
                priority: str, n_prompt: int, max_tokens: int, pin: str | None,
                budget_ms: int | None, beats: list[WorkerHeartbeat] | None = None) -> str:
    """Choose the job's pool and count the job there (place.lua: one atomic step, so a
    burst sees its own jobs); its record's `pool`, `backend` and `placement` fields are
    set. Returns the pool's id (its queues' name). A create that then does not happen
    gives the count back (`release`). `beats`: the live workers' heartbeats, when the
    caller read them already (before `in_order`'s lock: a read less inside it)."""
    if not cfg.pools:
        if budget_ms is not None:
            await check_budget(state, model, cfg, priority, n_prompt, max_tokens, budget_ms)
        return model
    names = list(cfg.pools)
    if beats is None:
        beats = list((await state.live_workers()).values())
    mine = {n: [b for b in beats if b.pool == pool_id(model, n)] for n in names}
    known = mean_pace([p for n in names if (p := combined_pace(mine[n]))]) or PRIOR
    args: list[str | int | float] = [budget_ms or 0]
    allowed = [bool(mine[n]) and pin in (None, n) for n in names]
    for n, ok in zip(names, allowed, strict=True):
        pace = combined_pace(mine[n]) or known
        first, decode = own_times(pace, n_prompt, max_tokens)
        args += [pool_id(model, n), sum(b.slots for b in mine[n]), pace.job_s, first, decode,
                 int(ok)]
    if not any(allowed):  # nobody serves it (yet): it waits for a worker there
        if budget_ms is not None:
            who = f"pool {pin!r}" if pin else "this model"
            raise BudgetUnreachable(f"no worker serves {who} now: no first token within "
                                    f"{budget_ms} ms", retry_after=5)
        name, ests = pin or names[0], {}
        await state.redis.hincrby(keys.POOL_LOAD, pool_id(model, name), 1)
    else:
        got = await _place_script(state)(keys=[keys.POOL_LOAD], args=args)
        ests = {n: [got[1 + 2 * i] / 1000, got[2 + 2 * i] / 1000]
                for i, n in enumerate(names) if mine[n]}
        if not got[0]:
            soonest = min(ests[n][0] for n, ok in zip(names, allowed, strict=True) if ok)
            raise BudgetUnreachable(
                f"no pool of this model is estimated to give the first token within "
                f"{budget_ms} ms (the soonest: {soonest * 1000:.0f} ms)",
                retry_after=max(1, math.ceil(soonest - (budget_ms or 0) / 1000)))
        name = names[got[0] - 1]
    if pin is not None:
        fields["pinned"] = "1"  # never moved to another pool (workers/rebalance.py)
    fields["pool"] = pool_id(model, name)
    fields["backend"] = select_backend(cfg.pool(name))
    fields["placement"] = json.dumps(ests)
    return fields["pool"]


UNORDERED: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()


def in_order(state: AppState, model: str,
             cfg: ModelConfig | None) -> contextlib.AbstractAsyncContextManager[Any]:
    """Held from a job's placement until its create: this replica's jobs of a model with
    several pools reach their lane in the order they were placed. (Without it, a burst's
    creates ran in whatever order the event loop resumed them, up to tens of ms apart, and
    a job counted n places behind in its pool found itself ahead of some of those, or
    behind some counted after it.) Not with `api.placement_in_order` off, nor with
    `api.durable_replicas`: its WAIT would hold every submit of the model behind it."""
    api = state.settings.api
    if cfg is None or not cfg.pools or not api.placement_in_order or api.durable_replicas:
        return UNORDERED
    locks: dict[str, asyncio.Lock] = state.background.setdefault("place_locks", {})
    return locks.setdefault(model, asyncio.Lock())


def _place_script(state: AppState) -> Any:
    """place.lua, registered once per API process."""
    script = state.background.get("place_script")
    if script is None:
        script = state.background["place_script"] = Scripts(state.redis, ("place",))["place"]
    return script


async def release(state: AppState, pool: str) -> None:
    """A placed job whose create did not happen (queue full, an idempotent replay): not
    counted in its pool any more."""
    if await state.redis.hincrby(keys.POOL_LOAD, pool, -1) < 0:
        await state.redis.hset(keys.POOL_LOAD, pool, 0)
