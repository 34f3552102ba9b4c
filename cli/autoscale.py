"""`tokenq autoscale`: worker processes per model follow the model's queue.

Each tick, per model: read queue depth (every priority), running jobs and free
slots from Redis (queues and worker heartbeats), let the model's Decider (see
cli/scaling.py) pick a worker count, then start workers the way `tokenq up`
does or drain the idlest ones with SIGTERM (stop taking jobs, finish or hand
back what runs). A worker that dies is forgotten, and the next tick starts a
new one if the queue still needs it. Live workers this process did not start
(a fixed pool) count as capacity (`external`), so min/max bound only our own.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from tokenq.cli import autoscale_catalogue as cat
from tokenq.cli.scaling import Decider, Decision, Inputs, Policy
from tokenq.shared import catalogue_io, keys
from tokenq.shared.catalogue import CatalogueEntry
from tokenq.shared.model_config import split_pool
from tokenq.shared.schemas import WorkerHeartbeat, live_workers
from tokenq.shared.settings import Settings
from tokenq.shared.weights import select_backend

log = logging.getLogger("tokenq.autoscale")

Spawn = Callable[[str], "subprocess.Popen[bytes]"]


def policy_from(settings: Settings, min_workers: int | None = None,
                max_workers: int | None = None) -> Policy:
    return Policy(
        min_workers=settings.autoscale.min_workers if min_workers is None else min_workers,
        max_workers=settings.autoscale.max_workers if max_workers is None else max_workers,
        up_window_s=settings.autoscale.up_window_s,
        down_window_s=settings.autoscale.down_window_s,
        cooldown_s=settings.autoscale.cooldown_s,
        target_per_worker=settings.autoscale.target_per_worker)


@dataclass
class Draining:
    model: str
    proc: subprocess.Popen[bytes]
    since: float  # monotonic time of the SIGTERM


@dataclass
class Autoscaler:
    r: redis.Redis
    settings: Settings
    models: list[str]
    policy: Policy
    spawn: Spawn
    clock: Callable[[], float] = time.monotonic
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)
    draining: list[Draining] = field(default_factory=list)
    drain_times: list[float] = field(default_factory=list)  # SIGTERM -> exit, seconds
    peak: dict[str, int] = field(default_factory=dict)
    _deciders: dict[str, Decider] = field(default_factory=dict)
    _last_logged: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    _config_slots: dict[str, int] = field(default_factory=dict)  # before any heartbeat
    _swept: dict[str, int] = field(default_factory=dict)  # retired model -> depth swept at
    _host: str = field(default_factory=socket.gethostname)
    # Models deployed over the API (the catalogue), scaled beside `models`
    # (cli/autoscale_catalogue.py); False: only `models`.
    follow_catalogue: bool = True
    # ... only those whose backend (as this host resolves `auto`) is one of these; empty:
    # every one. A CPU pool follows llama's, a GPU pool vLLM's.
    follow_backends: frozenset[str] = frozenset()
    followed: dict[str, cat.Followed] = field(default_factory=dict)
    # A new version's rollout: the old version's workers, drained one at a time (the next
    # once the one before has exited), as a scale-down drains; new-version workers come
    # as its queue asks (the old ones count as capacity meanwhile).
    rolling: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.instances = cat.Instances(self.r)
        registry = self.settings.models()
        for m in self.models:
            name, pool = split_pool(m)
            if name not in registry or (pool and pool not in registry[name].pools):
                raise SystemExit(f"unknown model or pool {m!r}; known: {', '.join(registry)}")
        # A model served by several pools (placement) is scaled pool by pool, each by its
        # own lanes and workers (`model@pool`).
        expanded: list[str] = []
        for m in self.models:
            pools = registry[m].pools if m in registry else {}
            expanded += [f"{m}@{p}" for p in pools] or [m]
        self.models = list(dict.fromkeys(expanded))
        for m in self.models:
            name, pool = split_pool(m)
            cfg = registry[name].pool(pool) if pool else registry[name]
            self._config_slots[m] = (cfg.max_num_seqs if select_backend(cfg) == "vllm"
                                     else cfg.n_parallel)
            self.procs.setdefault(m, [])
            self.peak.setdefault(m, 0)
            self._deciders[m] = Decider(self.policy)

    # -- reading Redis -----------------------------------------------------------------

    def observe(self, model: str) -> Inputs:
        pipe = self.r.pipeline(transaction=False)
        for q in keys.model_queues(model):
            pipe.llen(q)
        depth = sum(int(n) for n in pipe.execute())
        raw: dict[str, str] = self.r.hgetall(keys.WORKERS)  # type: ignore[assignment]
        beats = {wid: b for wid, b in live_workers(raw, self.settings.worker_ttl_s).items()
                 if (b.pool or b.model) == model}
        ours = self._worker_ids(model)
        return Inputs(
            depth=depth,
            running=sum(b.running for b in beats.values()),
            free_slots=sum(b.slots - b.running for b in beats.values()),
            slots_per_worker=max((b.slots for b in beats.values()),
                                 default=self._config_slots[model]),
            current=len(self.procs[model]),
            external=sum(1 for wid in beats if wid not in ours))

    def _worker_ids(self, model: str) -> set[str]:
        """Heartbeat ids (host:pid, as workers/runtime.py names a worker) of our workers."""
        procs = self.procs[model] + [d.proc for d in self.draining if d.model == model]
        return {f"{self._host}:{p.pid}" for p in procs}

    def _running_on(self, proc: subprocess.Popen[bytes]) -> int:
        try:
            info = self.r.hget(keys.WORKERS, f"{self._host}:{proc.pid}")
        except redis.RedisError:  # still drain (closing with Redis down), in any order
            return 0
        return WorkerHeartbeat.model_validate_json(info).running if info else 0

    # -- one tick ----------------------------------------------------------------------
    def tick(self) -> dict[str, Decision]:
        self._reap()
        self.instances.renew({p.pid for p in self._all_procs() if p.poll() is None})
        listed = catalogue_io.entries(self.r) if self.follow_catalogue else {}
        self._follow(listed)
        self._roll()
        self._sweep_retired(listed)
        out: dict[str, Decision] = {}
        for model in [*self.models, *self.followed]:
            inp = self.observe(model)
            entry = listed.get(model)
            if entry is not None and not self._active(entry, inp):
                continue
            d = self._deciders[model].decide(inp, self.clock())
            self._log(model, inp, d)
            if d.target > inp.current:
                for _ in range(d.target - inp.current):
                    if not self._start(model, entry):
                        break
            elif d.target < inp.current:
                self._drain(model, inp.current - d.target)
            self.peak[model] = max(self.peak[model], len(self.procs[model]))
            out[model] = d
        return out

    # -- the catalogue -----------------------------------------------------------------
    def _follow(self, listed: dict[str, CatalogueEntry]) -> None:
        """Start following models deployed over the API; a new version rolls the workers
        of the old one (`_roll`); a model gone from the catalogue is drained and forgotten."""
        for name, e in listed.items():
            if e.origin != "api" or name in self.models or e.phase == "retired":
                continue
            if self.follow_backends and select_backend(e.spec) not in self.follow_backends:
                if name in self.followed:  # switched to another pool's backend: let go
                    log.info("autoscale %s: now served by %s, not here; draining", name,
                             select_backend(e.spec))
                    self._let_go(name)
                continue
            f = self.followed.get(name)
            if f is not None and f.version == e.version:
                continue
            if f is not None:
                log.info("autoscale %s: version %d -> %d; rolling its %d old workers one at "
                         "a time", name, f.version, e.version, len(self.procs[name]))
                self.rolling.setdefault(name, []).extend(self.procs[name])
                self.procs[name] = []
            self.followed[name] = cat.Followed(e.version, e.keep_alive_s, cat.slots_of(e))
            self._config_slots[name] = cat.slots_of(e)
            self.procs.setdefault(name, [])
            self.peak.setdefault(name, 0)
            self._deciders[name] = Decider(cat.policy_for(self.policy, e, False))
        for name in [n for n in self.followed
                     if n not in listed or listed[n].phase == "retired"]:
            self._let_go(name)

    def _sweep_retired(self, listed: dict[str, CatalogueEntry]) -> None:
        """A retired model none of whose workers is left, here or anywhere: what is on its
        queues ends failed (cat.fail_leftovers), looked at again when its depth moves."""
        for name in [n for n, e in listed.items() if e.phase == "retired"
                     and not self.procs.get(n) and not any(d.model == n for d in self.draining)]:
            pipe = self.r.pipeline(transaction=False)
            for q in keys.model_queues(name):
                pipe.llen(q)
            depth = sum(int(n) for n in pipe.execute())
            if not depth or self._swept.get(name) == depth:
                continue
            raw: dict[str, str] = self.r.hgetall(keys.WORKERS)  # type: ignore[assignment]
            if any(b.model == name for b in live_workers(raw, self.settings.worker_ttl_s)
                   .values()):
                continue
            self._swept[name] = depth
            cat.fail_leftovers(self.r, self.settings, name)

    def _let_go(self, name: str) -> None:
        """Stop following a catalogue model: drain its workers (the old version's too)."""
        self.procs[name].extend(self.rolling.pop(name, []))
        self._drain(name, len(self.procs[name]))
        del self.followed[name]

    def _active(self, e: CatalogueEntry, inp: Inputs) -> bool:
        """Whether the model is scaled by its queue this tick (draining included)."""
        f = self.followed.get(e.name)
        if e.phase == "failed":
            self._drain(e.name, len(self.procs[e.name]))
            cat.fail_late_arrivals(self.r, self.settings, e, f, inp.depth)
            return False
        if e.phase == "retired" or (e.phase == "draining" and cat.retire_if_empty(
                self.r, e.name, inp.depth, inp.running)):
            self._drain(e.name, len(self.procs[e.name]))
            return False
        if f is not None and not f.loaded_once and e.keep_alive_s == 0 and inp.current:
            f.loaded_once = True  # keep_alive 0: never unloaded from now on
            self._deciders[e.name] = Decider(cat.policy_for(self.policy, e, True))
        return True

    def _log(self, model: str, inp: Inputs, d: Decision) -> None:
        """Every decision that differs from the last one logged for the model, with inputs."""
        key = (d.target, d.raw, d.reason)
        if self._last_logged.get(model) == key and not d.changes:
            return
        self._last_logged[model] = key
        log.info("autoscale %s: depth=%d running=%d free_slots=%d slots/worker=%d external=%d "
                 "current=%d recommended=%d -> target=%d (%s)", model, inp.depth, inp.running,
                 inp.free_slots, inp.slots_per_worker, inp.external, inp.current, d.raw,
                 d.target, d.reason)

    def _drain(self, model: str, n: int) -> None:
        """SIGTERM the n idlest workers (fewest running jobs; the newest among equals)."""
        procs = self.procs[model]
        order = sorted(range(len(procs)), key=lambda i: (self._running_on(procs[i]), -i))
        for i in sorted(order[:n], reverse=True):
            proc = procs.pop(i)
            proc.send_signal(signal.SIGTERM)
            self.draining.append(Draining(model, proc, self.clock()))
            log.info("autoscale %s: draining worker pid %d", model, proc.pid)

    def _start(self, model: str, entry: CatalogueEntry | None) -> bool:
        """One more worker for `model`; False when its `max_workers` leases are all taken
        (other pools run it)."""
        cap = entry.max_workers if entry is not None else None
        owner = self.instances.claim(model, cap) if cap is not None else None
        if cap is not None and owner is None:
            return False
        proc = self.spawn(model)
        self.procs[model].append(proc)
        if owner is not None and cap is not None:
            self.instances.hold(proc.pid, model, owner, cap)
        return True

    def _roll(self) -> None:
        """Drain the next old-version worker of each rollout once none of its model is
        draining any more."""
        for name, old in self.rolling.items():
            old[:] = [p for p in old if p.poll() is None]
            if old and not any(d.model == name for d in self.draining):
                proc = old.pop(0)
                proc.send_signal(signal.SIGTERM)
                self.draining.append(Draining(name, proc, self.clock()))
                log.info("autoscale %s: rolling: draining old worker pid %d (%d to go)", name,
                         proc.pid, len(old))

    def _all_procs(self) -> list[subprocess.Popen[bytes]]:
        return [*(p for ps in self.procs.values() for p in ps),
                *(d.proc for d in self.draining), *(p for ps in self.rolling.values() for p in ps)]

    def _reap(self) -> None:
        for model, procs in self.procs.items():
            for p in [p for p in procs if p.poll() is not None]:
                log.warning("autoscale %s: worker pid %d exited (%s); forgotten", model, p.pid,
                            p.returncode)
                procs.remove(p)
        for d in [d for d in self.draining if d.proc.poll() is not None]:
            took = self.clock() - d.since
            self.drain_times.append(took)
            self.draining.remove(d)
            log.info("autoscale %s: worker pid %d drained in %.1fs", d.model, d.proc.pid, took)

    # -- lifecycle ---------------------------------------------------------------------
    def step(self) -> None:
        """One tick; a Redis outage (or a worker that cannot be started: OSError) holds the
        workers as they are and is retried next tick, it does not end the loop."""
        try:
            self.tick()
        except (redis.RedisError, OSError) as exc:
            log.error("autoscale: tick failed (%s); holding", exc)

    def run(self, stop: threading.Event, interval_s: float) -> None:
        alive = self.settings.state_dir / "autoscaler.alive"
        while not stop.is_set():
            self.step()
            # Liveness for a supervisor (compose's healthcheck): the loop is turning.
            with contextlib.suppress(OSError):
                alive.parent.mkdir(parents=True, exist_ok=True)
                alive.touch()
            stop.wait(interval_s)

    def close(self, timeout_s: float) -> None:
        """Drain every worker (SIGTERM), wait up to `timeout_s`, then kill what is left."""
        for model in self.procs:
            self._drain(model, len(self.procs[model]))
        for model, old in self.rolling.items():
            self.procs[model].extend(old)
            old.clear()
            self._drain(model, len(self.procs[model]))
        deadline = time.monotonic() + timeout_s
        for d in list(self.draining):
            try:
                d.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
        self._reap()
        with contextlib.suppress(redis.RedisError):  # let go of its instance leases
            self.instances.renew(set())
