"""The model catalogue behind `/v1/models` (admin: POST, PATCH, DELETE; GET adds state):
deploy, patch and retire one entry of shared/catalogue.py, seed it at start, and keep the
API's model table (`state.models`) following it.

`state.models` stays the dict every route reads; `refresh` rewrites it in place when
tokenq:catalogue:version moved (one GET per `catalogue_poll_s`, and at once after a
change made here): the API's own registry (its bundled defaults and models file, as
before), plus the models deployed over the API, less those retired, draining or failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, WatchError

from tokenq.api.deps import AppState
from tokenq.api.errors import Conflict, InvalidRequest, NotFound
from tokenq.shared import aio, keys
from tokenq.shared.catalogue import (
    CATALOGUE,
    CATALOGUE_EVENTS,
    CATALOGUE_VERSION,
    CatalogueEntry,
    QueuedOnRetire,
    SpecError,
    check_weights,
    parse_load_request,
    public,
    seed_entry,
)
from tokenq.shared.catalogue_io import SCRIPT, parse_entries
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.schemas import JobErrorInfo, live_workers
from tokenq.shared.settings import ModelConfig

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often a replica looks at the catalogue's version (the changing one: at once)


class ModelExists(Conflict):
    code = "model_exists"


def invalid(exc: SpecError) -> InvalidRequest:
    return InvalidRequest(exc.message, param=exc.param, code="invalid_model_spec")


async def entries(r: aioredis.Redis) -> dict[str, CatalogueEntry]:
    return parse_entries(await r.hgetall(CATALOGUE))  # type: ignore[arg-type]


async def get_entry(r: aioredis.Redis, name: str) -> CatalogueEntry | None:
    raw = await r.hget(CATALOGUE, name)
    return CatalogueEntry.model_validate_json(raw) if raw else None


async def _write(r: aioredis.Redis, name: str,
                 change: Callable[[CatalogueEntry | None], CatalogueEntry | None]
                 ) -> CatalogueEntry | None:
    """Apply `change(entry or None) -> entry` atomically (None: write nothing); bumps the
    version and wakes the readers."""
    while True:
        async with r.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(CATALOGUE)
                raw = await pipe.hget(CATALOGUE, name)
                entry = change(CatalogueEntry.model_validate_json(raw) if raw else None)
                if entry is None:
                    return None
                entry.touch()
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.hset(CATALOGUE, name, entry.model_dump_json())
                pipe.incr(CATALOGUE_VERSION)
                pipe.xadd(CATALOGUE_EVENTS, {"name": name}, maxlen=1000, approximate=True)
                await pipe.execute()
                return entry
            except WatchError:
                continue


# -- the API's model table -------------------------------------------------------------

class ModelTable:
    """The registry this replica started with, and the catalogue version it last applied."""

    def __init__(self, registry: dict[str, ModelConfig]):
        self.registry = dict(registry)
        self.seen = -1

    def apply(self, models: dict[str, ModelConfig], catalogue: dict[str, CatalogueEntry]
              ) -> list[str]:
        """Rewrite `models` in place; the names whose config changed or went away."""
        table = dict(self.registry)
        for name, e in catalogue.items():
            if not e.served:
                table.pop(name, None)
            elif e.origin == "api":
                table[name] = e.spec
        changed = [n for n, cfg in models.items() if table.get(n) != cfg]
        for name in [n for n in models if n not in table]:
            del models[name]
        models.update(table)
        return changed


def table_of(state: AppState) -> ModelTable:
    table = state.background.get("model_table")
    if not isinstance(table, ModelTable):
        table = state.background["model_table"] = ModelTable(state.models)
    return table


async def refresh(state: AppState, force: bool = False) -> None:
    table = table_of(state)
    seen = int(await state.redis.get(CATALOGUE_VERSION) or 0)
    if seen == table.seen and not force:
        return
    changed = table.apply(state.models, await entries(state.redis))
    table.seen = seen
    vocabs = getattr(state.counter, "_vocabs", None)  # a new version's weights: read again
    if isinstance(vocabs, dict):
        for name in changed:
            vocabs.pop(name, None)


async def seed(state: AppState) -> None:
    """Write this replica's registry into the catalogue: a new name, or a seeded entry
    whose spec changed (the models file was edited). An entry deployed over the API, or a
    retired one, is left as it is."""
    for name, cfg in table_of(state).registry.items():
        def change(e: CatalogueEntry | None, name: str = name, cfg: ModelConfig = cfg
                   ) -> CatalogueEntry | None:
            if e is None:
                return seed_entry(name, cfg)
            if e.origin == "seed" and e.phase == "active" and e.spec != cfg:
                fresh = seed_entry(name, cfg)
                fresh.version, fresh.created_at = e.version + 1, e.created_at
                return fresh
            return None

        await _write(state.redis, name, change)


async def follow(state: AppState, stop: asyncio.Event) -> None:
    """Seed, then keep state.models following the catalogue until `stop`."""
    while not stop.is_set():
        try:
            await seed(state)
            break
        except RedisError as exc:
            log.warning("catalogue: seeding failed (%s); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    while not stop.is_set():
        try:
            await refresh(state)
        except RedisError as exc:
            log.warning("catalogue: refresh failed (%s)", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


# -- admin operations ------------------------------------------------------------------

async def _checked(state: AppState, body: dict[str, Any]
                   ) -> tuple[str, ModelConfig, dict[str, Any]]:
    try:
        name, cfg, opts = parse_load_request(body)
        if opts["check_path"]:
            await asyncio.to_thread(check_weights, cfg, cfg.backend)
    except SpecError as exc:
        raise invalid(exc) from exc
    if await state.redis.hexists(keys.ADAPTERS, name):
        raise InvalidRequest(f"{name!r} is a LoRA adapter's name; pick another",
                             param="name", code="invalid_model_spec")
    return name, cfg, opts


async def deploy(state: AppState, body: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/models: a new entry (or a retired name deployed again, as a new version)."""
    name, cfg, opts = await _checked(state, body)

    def change(e: CatalogueEntry | None) -> CatalogueEntry:
        if e is not None and e.phase != "retired":
            raise ModelExists(f"model {name!r} exists (version {e.version}, {e.phase}); "
                              "PATCH it for a new version, or DELETE it first",
                              param="name")
        return CatalogueEntry(name=name, spec=cfg, request=dict(body), origin="api",
                              version=e.version + 1 if e else 1,
                              keep_alive_s=opts["keep_alive_s"],
                              max_load_tries=opts["max_load_tries"],
                              max_workers=opts["max_workers"])

    entry = await _write(state.redis, name, change)
    assert entry is not None
    await refresh(state, force=True)
    return await show(state, entry, admin=True)


async def patch(state: AppState, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """PATCH /v1/models/{name}: the load request with `changes` merged in, as a new version
    (a failed model gets its tries back)."""
    cur = await get_entry(state.redis, name)
    if cur is None or cur.phase == "retired":
        raise NotFound(f"no model {name!r} in the catalogue", param="name")
    _check_managed(cur)
    if "name" in changes and changes["name"] != name:
        raise InvalidRequest("a model cannot be renamed; deploy it under the new name",
                             param="name", code="invalid_model_spec")
    merged = {**cur.request, **changes, "name": name}
    if "backend" in changes:  # the other engine's knobs do not carry over a switch
        merged = {k: v for k, v in merged.items() if k in changes or not _foreign(k, merged)}
    _, cfg, opts = await _checked(state, merged)

    def change(e: CatalogueEntry | None) -> CatalogueEntry:
        if e is None or e.phase == "retired":
            raise NotFound(f"no model {name!r} in the catalogue", param="name")
        _check_managed(e)
        return CatalogueEntry(name=name, spec=cfg, request=merged, origin="api",
                              version=e.version + 1, created_at=e.created_at,
                              keep_alive_s=opts["keep_alive_s"],
                              max_load_tries=opts["max_load_tries"],
                              max_workers=opts["max_workers"])

    entry = await _write(state.redis, name, change)
    assert entry is not None
    await refresh(state, force=True)
    return await show(state, entry, admin=True)


def _check_managed(e: CatalogueEntry) -> None:
    """A seeded model is the models file's: its workers read their config from there, not
    from the catalogue, so a new version would change what the API promises (its context,
    its defaults) and not what they run."""
    if e.origin == "seed":
        raise Conflict(f"model {e.name!r} is served from the models file (the bundled "
                       "defaults or TOKENQ_MODELS_FILE), which its workers read: change it "
                       "there and restart, or deploy the new version under another name",
                       param="name", code="model_not_managed")


def _foreign(field: str, req: dict[str, Any]) -> bool:
    from tokenq.shared.catalogue import LLAMA_KNOBS, VLLM_KNOBS

    backend = req.get("backend", "auto")
    return field in (VLLM_KNOBS if backend == "llama" else
                     LLAMA_KNOBS if backend == "vllm" else set())


async def retire(state: AppState, name: str, queued: QueuedOnRetire) -> dict[str, Any]:
    """DELETE /v1/models/{name}: new jobs are refused at once. `queued=finish`: the jobs
    already queued run first (the entry is `draining` until its queues are empty; the
    autoscaler then retires it); `queued=fail`: they end `failed` with model_retired now."""
    def change(e: CatalogueEntry | None) -> CatalogueEntry:
        if e is None or e.phase == "retired":
            raise NotFound(f"no model {name!r} in the catalogue", param="name")
        e.phase = "draining" if queued == "finish" else "retired"
        e.queued_on_retire = queued
        return e

    entry = await _write(state.redis, name, change)
    assert entry is not None
    await refresh(state, force=True)
    failed = 0
    if queued == "fail":
        err = JobErrorInfo(code="model_retired", message=f"model {name!r} was retired")
        failed = await fail_queued(state, name, err)
    return {**await show(state, entry, admin=True), "queued_failed": failed}


async def fail_queued(state: AppState, model: str, err: JobErrorInfo) -> int:
    r = state.redis
    job_keys: list[str] = await r.zrange(keys.QUEUED, 0, -1)  # type: ignore[assignment]
    pipe = r.pipeline(transaction=False)
    for k in job_keys:
        pipe.hget(k, "model")
    mine = [k for k, m in zip(job_keys, await pipe.execute(), strict=True) if m == model]
    script = Scripts(r, (SCRIPT,))[SCRIPT]
    s, done = state.settings, 0
    for k in mine:
        job_id = keys.job_id_of(k)
        done += int(await script(keys=[k, keys.job_events(job_id), keys.RUNNING,
                                       keys.job_lease(job_id)],
                                 args=["fail", model, err.model_dump_json(), repr(time.time()),
                                       s.stream_maxlen, s.result_ttl_s]))
    return done


async def workers_of(state: AppState, name: str) -> list[str]:
    raw: dict[str, str] = await state.redis.hgetall(keys.WORKERS)  # type: ignore[assignment]
    return [w for w, hb in live_workers(raw, state.settings.worker_ttl_s).items()
            if hb.model == name]


async def show(state: AppState, entry: CatalogueEntry, admin: bool) -> dict[str, Any]:
    return public(entry, await workers_of(state, entry.name), admin)


def start(state: AppState) -> Callable[[], Any]:
    """Start following the catalogue (the app's lifespan); returns the coroutine function
    that stops it."""
    stop = asyncio.Event()
    task = asyncio.create_task(follow(state, stop), name="tokenq-catalogue")

    async def close() -> None:
        stop.set()
        await aio.stop(task, 5)

    return close


def fixed(state: AppState, name: str) -> bool:
    """A model of this replica's own registry (its workers are expected up: /ready), not
    one deployed over the API (loaded on demand)."""
    return name in table_of(state).registry
