"""The worker's heartbeat thread: its record in `tokenq:workers`, its leases, the rescue.

Every heartbeat_s it renews its jobs' leases (first: after a stall, its own reconcile
must not find its own leases expired and hand its jobs to another attempt), writes its
WorkerHeartbeat (what /ready, /metrics, the admin routes and the autoscaler read), and
runs the reconciler when due. An engine that can no longer serve ends the worker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from tokenq.shared import keys
from tokenq.shared.metrics import WorkerMetrics
from tokenq.shared.schemas import WorkerHeartbeat
from tokenq.shared.settings import Settings
from tokenq.workers.engines.base import Engine
from tokenq.workers.leases import Leases
from tokenq.workers.lora_watcher import AdapterWatcher
from tokenq.workers.pace import PaceMeter
from tokenq.workers.reconciler import Reconciler

log = logging.getLogger(__name__)


def advertised_metrics_host(s: Settings) -> str:
    """Where Prometheus reaches this worker's metrics port (the API's /metrics/targets)."""
    if s.worker.metrics_host:
        return s.worker.metrics_host
    bound = s.worker.metrics_addr
    if bound not in ("", "0.0.0.0", "::"):
        return bound
    # Bound to all: this host's address as its own /etc/hosts has it (a container's or
    # pod's IP), which resolves from anywhere on its network, unlike a container id.
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()


@dataclass
class Heartbeat:
    r: redis.Redis
    settings: Settings
    worker_id: str
    model: str
    engine: Engine
    adapters: AdapterWatcher
    metrics: WorkerMetrics
    leases: Leases
    reconciler: Reconciler
    on_engine_died: Callable[[], None]
    on_redis_gone: Callable[[float], None]
    pool: str = ""  # its queues' name (placement): the model, or `model@pool`
    pace: PaceMeter = field(default_factory=PaceMeter)
    metrics_port: int | None = None  # advertised once the metrics server is up
    metrics_host: str = ""
    bound_to_all: bool = False  # metrics_host is this host's address, read every beat
    _stop: threading.Event = field(default_factory=threading.Event)
    _stopped_steps: int = 0  # the engine's count at the last beat

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tokenq-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> None:
        st = self.engine.stats()
        hb = WorkerHeartbeat(
            model=self.model, backend=self.engine.backend, slots=st.slots, running=st.running,
            waiting=st.waiting, kv_cache_usage=st.kv_cache_usage,
            prefix_hit_ratio=st.prefix_hit_ratio,
            max_model_len=getattr(self.engine, "max_model_len", None),
            metrics_port=self.metrics_port,
            metrics_host=self.metrics_host, ts=time.time(), pid=os.getpid(),
            adapters=self.adapters.summary(), pool=self.pool or self.model,
            pace=self.pace.snapshot())
        self.r.hset(keys.WORKERS, self.worker_id, hb.model_dump_json())
        self.metrics.kv_cache.labels(self.model).set(st.kv_cache_usage)
        self.metrics.prefix_hit.labels(self.model).set(st.prefix_hit_ratio)
        # the engine counts; Prometheus' counter follows it by the difference
        if st.stopped_steps > self._stopped_steps:
            self.metrics.steps_stopped.labels(self.model).inc(
                st.stopped_steps - self._stopped_steps)
            self._stopped_steps = st.stopped_steps

    def forget(self) -> None:
        """Leave the pool: /ready and the slot counts stop counting this worker at once."""
        self.r.hdel(keys.WORKERS, self.worker_id)

    def stalled_grammars(self) -> list[tuple[str, int]]:
        """(job, attempt) of each job whose grammar llama.cpp has applied for longer than
        `grammar_stall_s` without returning: its engine's thread, and every job on it, is
        stuck there, and no cancel reaches into that call (runtime.py marks them poison)."""
        limit = self.settings.worker.grammar_stall_s
        busy = getattr(self.engine, "grammar_busy", None)
        if not limit or busy is None:
            return []
        now = time.monotonic()
        return [(job, attempt) for job, attempt, since in busy() if now - since > limit]

    def _run(self) -> None:
        s = self.settings
        last = reached = time.monotonic()
        while not self._stop.wait(s.worker.heartbeat_s):
            now = time.monotonic()
            if now - last > s.worker.lease_ttl_s / 2:
                log.warning("heartbeat %.1f s late (process or machine stalled); leases may "
                            "have expired", now - last - s.worker.heartbeat_s)
            last = now
            if not self.engine.healthy() or self.stalled_grammars():
                self.on_engine_died()
                return
            try:
                self.leases.renew()
                if self.bound_to_all:  # an address that changed (a container moved) follows
                    self.metrics_host = advertised_metrics_host(s)
                self.beat()
                reached = time.monotonic()
                self.reconciler.maybe_run()
            except redis.RedisError:
                log.exception("heartbeat failed")
                gone = time.monotonic() - reached
                if s.worker.redis_give_up_s and gone > s.worker.redis_give_up_s:
                    self.on_redis_gone(gone)
                    return
