"""The catalogue in Redis for the synchronous processes (workers, the autoscaler): read an
entry, change one atomically, tell a model's queued jobs about its load (the API's
asyncio side is api/models_admin.py).

A worker loading a model writes `loading_since` and gives its queued jobs a `queued` event
with reason "loading"; a load that fails counts against the version's `max_load_tries`,
and the last allowed failure marks the entry `failed` and fails the model's queued jobs
with `model_load_failed` and the engine's message.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

import redis
from redis.exceptions import WatchError

from tokenq.shared import keys
from tokenq.shared.catalogue import (
    CATALOGUE,
    CATALOGUE_EVENTS,
    CATALOGUE_VERSION,
    CatalogueEntry,
)
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.schemas import JobErrorInfo
from tokenq.shared.settings import ModelConfig, Settings

log = logging.getLogger(__name__)

SCRIPT = "model_jobs"
LOADING_EVENT = json.dumps({"reason": "loading"})


def get_entry(r: redis.Redis, name: str) -> CatalogueEntry | None:
    raw = r.hget(CATALOGUE, name)
    return CatalogueEntry.model_validate_json(raw) if raw else None


def entries(r: redis.Redis) -> dict[str, CatalogueEntry]:
    return parse_entries(r.hgetall(CATALOGUE))  # type: ignore[arg-type]


def parse_entries(raw: dict[str, str]) -> dict[str, CatalogueEntry]:
    """The catalogue's entries; one an older tokenq wrote that this one's bounds refuse
    (a spec's n_ctx of -5) is left out, with an error logged, not a reader that fails
    on every later read (the API's poll, every worker's)."""
    out = {}
    for name, value in sorted(raw.items()):
        try:
            out[name] = CatalogueEntry.model_validate_json(value)
        except ValueError as exc:
            log.error("model %r: its catalogue entry is not valid here, left out: %s", name,
                      exc)
    return out


def version(r: redis.Redis) -> int:
    return int(r.get(CATALOGUE_VERSION) or 0)


def update(r: redis.Redis, name: str,
           change: Callable[[CatalogueEntry], CatalogueEntry | None]) -> CatalogueEntry | None:
    """Apply `change(entry)` to an existing entry atomically (retried when another process
    wrote the hash in between); None from `change` (or no entry): nothing written."""
    while True:
        with r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(CATALOGUE)  # type: ignore[no-untyped-call]
                raw = pipe.hget(CATALOGUE, name)
                if not raw:
                    return None
                entry = change(CatalogueEntry.model_validate_json(raw))
                if entry is None:
                    return None
                entry.touch()
                pipe.multi()
                pipe.hset(CATALOGUE, name, entry.model_dump_json())
                pipe.incr(CATALOGUE_VERSION)
                pipe.xadd(CATALOGUE_EVENTS, {"name": name}, maxlen=1000, approximate=True)
                pipe.execute()
                return entry
            except WatchError:
                continue


def config_for(settings: Settings, name: str, entry: CatalogueEntry | None) -> ModelConfig:
    """What a worker started for `name` loads: the catalogue's spec for a model deployed
    over the API, else its own registry's entry, else a seeded entry another host wrote."""
    registry = settings.models()
    if entry is not None and entry.phase in ("failed", "retired"):
        raise SystemExit(f"model {name!r} is {entry.phase} in the catalogue"
                         + (f" ({entry.error})" if entry.error else "")
                         + "; PATCH or deploy it again to serve it")
    if entry is not None and (entry.origin == "api" or name not in registry):
        return entry.spec
    if name in registry:
        return registry[name]
    raise SystemExit(f"unknown model {name!r}: not in the catalogue, and the registry here "
                     f"knows {', '.join(registry)}")


def model_jobs(r: redis.Redis, settings: Settings, model: str, mode: str, data: str) -> int:
    """Run shared/lua/model_jobs.lua on every queued job of `model` (mode 'fail' with an
    error, 'loading' with an event; 'fail_orphan' on its running jobs too): the number it
    acted on."""
    job_keys: list[str] = r.zrange(keys.QUEUED, 0, -1)  # type: ignore[assignment]
    if mode == "fail_orphan":
        job_keys += r.zrange(keys.RUNNING, 0, -1)  # type: ignore[arg-type]
    if not job_keys:
        return 0
    pipe = r.pipeline(transaction=False)
    for k in job_keys:
        pipe.hget(k, "model")
    mine = [k for k, m in zip(job_keys, pipe.execute(), strict=True) if m == model]
    script = Scripts(r, (SCRIPT,))[SCRIPT]
    done = 0
    for k in mine:
        job_id = keys.job_id_of(k)
        done += int(script(keys=[k, keys.job_events(job_id), keys.RUNNING,
                                 keys.job_lease(job_id)],
                           args=[mode, model, data, repr(time.time()),
                                 settings.stream_maxlen, settings.result_ttl_s]))
    return done


def mark_loading(r: redis.Redis, settings: Settings, name: str) -> None:
    """A worker starts building the engine: the entry says `loading`, and the model's
    queued jobs' streams say why they wait."""
    def change(e: CatalogueEntry) -> CatalogueEntry:
        e.loading_since = time.time()
        return e

    if update(r, name, change) is not None:
        model_jobs(r, settings, name, "loading", LOADING_EVENT)


def mark_loaded(r: redis.Redis, name: str) -> None:
    def change(e: CatalogueEntry) -> CatalogueEntry:
        e.loading_since, e.load_failures, e.error = None, 0, None
        return e

    update(r, name, change)


def mark_load_failed(r: redis.Redis, settings: Settings, name: str, error: str) -> bool:
    """Count a failed load; at the version's max_load_tries the entry is `failed` and its
    queued jobs fail with model_load_failed. True when that happened."""
    def change(e: CatalogueEntry) -> CatalogueEntry:
        e.loading_since = None
        e.load_failures += 1
        e.error = error
        if e.load_failures >= e.max_load_tries and e.phase == "active":
            e.phase = "failed"
        return e

    entry = update(r, name, change)
    if entry is None or entry.phase != "failed":
        return False
    err = JobErrorInfo(code="model_load_failed",
                       message=f"model {name!r} could not be loaded "
                               f"({entry.load_failures} tries): {error}")
    n = model_jobs(r, settings, name, "fail", err.model_dump_json())
    log.error("model %s: failed to load %d times; marked failed, %d queued jobs failed",
              name, entry.load_failures, n)
    return True
