"""LoRA adapter logic behind the admin routes and job submission.

Load, unload and rollback each change one registry record (shared/lora_registry.py) in a
WATCH/MULTI transaction that also appends to tokenq:adapters:events (the workers'
watchers block on it, so they act at once; they also re-read every `adapter_poll_s`),
then wait for the base model's live workers to report that they now serve the new state
(tokenq:adapter:{name}:acks). A load a worker cannot do (bad path,
wrong format, rank over the engine's limit) is rolled back and answered with the
worker's error, so a bad adapter never serves a job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from tokenq.api.deps import AppState
from tokenq.api.errors import Conflict, InvalidRequest, ModelNotFound, NotFound
from tokenq.shared import keys
from tokenq.shared.lora_registry import AdapterAck, AdapterRecord, AdapterRef
from tokenq.shared.weights import select_backend


async def get_record(r: aioredis.Redis, name: str) -> AdapterRecord | None:
    raw = await r.hget(keys.ADAPTERS, name)
    return AdapterRecord.model_validate_json(raw) if raw else None


async def list_records(r: aioredis.Redis) -> list[AdapterRecord]:
    raw: dict[str, str] = await r.hgetall(keys.ADAPTERS)  # type: ignore[assignment]
    return [AdapterRecord.model_validate_json(v) for _, v in sorted(raw.items())]


async def resolve(state: AppState, model: str, tenant: str) -> tuple[str, AdapterRef] | None:
    """`model` names a loaded adapter `tenant` may use (its own, or shared): (its base
    model, the version a new job gets). None otherwise: absent and not yours look alike."""
    rec = await get_record(state.redis, model)
    ref = rec.ref() if rec is not None else None
    if rec is None or ref is None or rec.base not in state.models or not rec.usable_by(tenant):
        return None
    return rec.base, ref


async def _update(r: aioredis.Redis, name: str, change: Any) -> AdapterRecord:
    """Apply `change(record | None) -> record` atomically (retried if another replica
    wrote the hash in between)."""
    while True:
        async with r.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(keys.ADAPTERS)
                raw = await pipe.hget(keys.ADAPTERS, name)
                rec: AdapterRecord = change(
                    AdapterRecord.model_validate_json(raw) if raw else None)
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.hset(keys.ADAPTERS, name, rec.model_dump_json())
                # wakes every worker's watcher now instead of at its next poll
                pipe.xadd(keys.ADAPTER_EVENTS, {"name": name}, maxlen=1000, approximate=True)
                await pipe.execute()
                return rec
            except WatchError:
                continue


async def load(state: AppState, name: str, base: str, path: str,
               wait_s: float, owner: str, shared: bool) -> dict[str, Any]:
    if name in state.models:
        raise InvalidRequest(f"{name!r} is a base model's name", param="name")
    cfg = state.models.get(base)
    if cfg is None:
        raise ModelNotFound(f"model {base!r} is not served here", param="model")
    vid = int(await state.redis.incr(keys.ADAPTER_SEQ))

    def change(rec: AdapterRecord | None) -> AdapterRecord:
        if rec is None:
            rec = AdapterRecord(name=name, base=base, engine=select_backend(cfg),
                                status="unloaded", current=None)
        elif rec.base != base:
            raise Conflict(f"adapter {name!r} belongs to {rec.base!r}; unload it there or "
                           "pick another name", param="name")
        rec.load(vid, path)
        rec.owner, rec.shared = owner, shared
        return rec

    started = time.monotonic()
    rec = await _update(state.redis, name, change)
    acks, pending = await wait_acks(state, rec, vid, wait_s)
    failed = {w: a for w, a in acks.items() if not a.ok}
    if failed:
        def undo(cur: AdapterRecord | None) -> AdapterRecord:
            assert cur is not None
            if cur.current == vid and cur.status == "loaded":
                cur.rollback()
                cur.versions = [v for v in cur.versions if v.id != vid]
            return cur

        await _update(state.redis, name, undo)
        wid, ack = next(iter(failed.items()))
        raise InvalidRequest(f"worker {wid} could not load adapter {name!r} from {path!r}: "
                             f"{ack.error}; nothing changed", param="path",
                             code="adapter_load_failed")
    rank = next((a.rank for a in acks.values() if a.rank is not None), None)
    if rank is not None:
        def set_rank(cur: AdapterRecord | None) -> AdapterRecord:
            assert cur is not None
            v = cur.version(vid)
            if v is not None:
                v.rank = rank
            return cur

        rec = await _update(state.redis, name, set_rank)
    return _answer(rec, acks, pending, time.monotonic() - started)


async def unload(state: AppState, name: str, wait_s: float) -> dict[str, Any]:
    def change(rec: AdapterRecord | None) -> AdapterRecord:
        if rec is None:
            raise NotFound(f"no adapter {name!r}", param="name")
        if rec.status != "loaded":
            raise Conflict(f"adapter {name!r} is not loaded", param="name")
        rec.unload()
        return rec

    started = time.monotonic()
    rec = await _update(state.redis, name, change)
    acks, pending = await wait_acks(state, rec, 0, wait_s)
    return _answer(rec, acks, pending, time.monotonic() - started)


async def rollback(state: AppState, name: str, wait_s: float) -> dict[str, Any]:
    def change(rec: AdapterRecord | None) -> AdapterRecord:
        if rec is None:
            raise NotFound(f"no adapter {name!r}", param="name")
        if not rec.rollback():
            raise Conflict(f"adapter {name!r} has nothing to roll back to", param="name")
        return rec

    started = time.monotonic()
    rec = await _update(state.redis, name, change)
    ref = rec.ref()
    acks, pending = await wait_acks(state, rec, ref.id if ref else 0, wait_s)
    return _answer(rec, acks, pending, time.monotonic() - started)


async def wait_acks(state: AppState, rec: AdapterRecord, want: int,
                    wait_s: float) -> tuple[dict[str, AdapterAck], list[str]]:
    """Until every live worker of the base model reports version `want` (0 = none) or an
    error for it, or `wait_s` passes: (acks of those that answered, those still pending)."""
    deadline = time.monotonic() + wait_s
    while True:
        live = await _live_workers(state, rec.base)
        raw: dict[str, str] = await state.redis.hgetall(  # type: ignore[assignment]
            keys.adapter_acks(rec.name))
        acks = {w: AdapterAck.model_validate_json(raw[w]) for w in live if w in raw}
        done = {w: a for w, a in acks.items() if a.id == want}
        pending = [w for w in live if w not in done]
        if not pending or time.monotonic() >= deadline:
            return done, pending
        await asyncio.sleep(0.01)  # an admin call's latency is mostly this wait


async def _live_workers(state: AppState, model: str) -> list[str]:
    return [wid for wid, hb in (await state.live_workers()).items() if hb.model == model]


def _answer(rec: AdapterRecord, acks: dict[str, AdapterAck], pending: list[str],
            seconds: float) -> dict[str, Any]:
    return {**rec.public(), "seconds": round(seconds, 3),
            "workers": {w: a.model_dump(exclude={"ts"}) for w, a in acks.items()},
            "pending_workers": pending}
