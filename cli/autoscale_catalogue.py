"""What the autoscaler takes from the model catalogue (shared/catalogue.py) each tick.

A model deployed over the API is scaled like the models named at start, with its own
policy: no worker until its queue has work (load on demand), and back to none after
`keep_alive_s` without work (0: never unloaded once loaded). A new version (PATCH) rolls
the workers of the old one, one at a time, each drained as a scale-down drains (its jobs
handed back, continued from their tokens by a new-version worker); new-version workers
come as the queue asks. A `draining` model (retired
with its queued jobs left to finish) is scaled by its queue until it is empty, then marked
`retired`; a `retired` or `failed` model has its workers drained, and a failed model's
late arrivals (jobs the API took before it saw the failure) fail with model_load_failed.
Once a retired model has no worker left, what is still on its queues (a job a draining
worker handed back, still `running` with no worker holding it) fails with model_retired:
nothing would ever take it.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import uuid
from dataclasses import dataclass, replace

import redis

from tokenq.cli.scaling import Policy
from tokenq.shared import catalogue_io
from tokenq.shared.catalogue import CATALOGUE, CatalogueEntry
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.schemas import JobErrorInfo
from tokenq.shared.weights import select_backend

log = logging.getLogger("tokenq.autoscale")


@dataclass
class Followed:
    """A catalogue model this autoscaler scales: the version its workers run."""

    version: int
    keep_alive_s: float
    slots: int
    loaded_once: bool = False
    failed_depth: int = -1  # queue depth when its queued jobs were last failed


def policy_for(base: Policy, entry: CatalogueEntry, loaded_once: bool) -> Policy:
    """Load on demand; unload after keep_alive_s idle (0: never, once loaded)."""
    ka = entry.keep_alive_s
    if ka == 0:
        return replace(base, min_workers=1 if loaded_once else 0)
    return replace(base, min_workers=0, up_window_s=0.0, down_window_s=ka, cooldown_s=ka)


def slots_of(entry: CatalogueEntry) -> int:
    cfg = entry.spec
    return cfg.max_num_seqs if select_backend(cfg) == "vllm" else cfg.n_parallel


def retire_if_empty(r: object, name: str, depth: int, running: int) -> bool:
    """A draining model whose queues are empty and whose jobs have ended: `retired`."""
    if depth or running:
        return False

    def change(e: CatalogueEntry) -> CatalogueEntry | None:
        if e.phase != "draining":
            return None
        e.phase = "retired"
        return e

    done = catalogue_io.update(r, name, change) is not None  # type: ignore[arg-type]
    if done:
        log.info("autoscale %s: drained; retired", name)
    return done


def fail_late_arrivals(r: object, settings: object, entry: CatalogueEntry,
                       followed: Followed | None, depth: int) -> None:
    """A failed model's jobs that arrived after it failed end as its queued jobs did
    (looked for again only when its queue depth changed)."""
    if depth == 0 or (followed is not None and followed.failed_depth == depth):
        return
    if followed is not None:
        followed.failed_depth = depth
    err = JobErrorInfo(code="model_load_failed",
                       message=f"model {entry.name!r} could not be loaded: {entry.error}")
    catalogue_io.model_jobs(r, settings, entry.name, "fail",  # type: ignore[arg-type]
                            err.model_dump_json())


def fail_leftovers(r: object, settings: object, name: str) -> None:
    """A retired model with no worker left: its queued jobs, and its running ones no worker
    holds (handed back by a draining worker), end `failed` with model_retired."""
    err = JobErrorInfo(code="model_retired", message=f"model {name!r} was retired")
    n = catalogue_io.model_jobs(r, settings, name, "fail_orphan",  # type: ignore[arg-type]
                                err.model_dump_json())
    if n:
        log.info("autoscale %s: retired with no worker left; %d jobs failed", name, n)


class Instances:
    """A catalogue model's instance leases (`max_workers`, shared/lua/instance.lua): this
    pool claims one before it starts a worker for such a model, renews it every tick while
    the worker lives, and releases it when the worker has exited. A pool that dies leaves
    its leases to expire (`ttl_ms`), then another pool may start the model."""

    def __init__(self, r: redis.Redis, ttl_ms: int = 30_000):
        self.r = r
        self.ttl_ms = ttl_ms
        self._script = Scripts(r, ("instance",))["instance"]
        self._prefix = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:"
        self._seq = itertools.count()
        self.held: dict[int, tuple[str, str, int]] = {}  # worker pid -> (model, owner, max)

    def claim(self, model: str, max_n: int) -> str | None:
        """An owner token for one more worker of `model`, or None: every lease is taken."""
        owner = f"{self._prefix}{next(self._seq)}"
        return owner if self._script(keys=[instances_key(model)],
                                     args=[owner, max_n, self.ttl_ms]) else None

    def hold(self, pid: int, model: str, owner: str, max_n: int) -> None:
        self.held[pid] = (model, owner, max_n)

    def renew(self, alive: set[int]) -> None:
        """Renew the leases of workers still alive; release those of the others."""
        for pid, (model, owner, max_n) in list(self.held.items()):
            if pid in alive:
                self._script(keys=[instances_key(model)], args=[owner, max_n, self.ttl_ms])
            else:
                self.r.zrem(instances_key(model), owner)
                del self.held[pid]


def instances_key(model: str) -> str:
    return f"{CATALOGUE}:instances:{model}"
