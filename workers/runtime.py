"""Everything one worker process owns, built in the worker start hook (never at import)
and bound to its Celery app, where the generate task finds it.

The parts: the engine and the publisher that writes its steps (workers/publisher.py),
the cancel watcher (workers/cancels.py),
the heartbeat (workers/heartbeat.py) that keeps the leases (workers/leases.py) and
runs the rescue (workers/reconciler.py), the drainer (workers/drain.py), the preemptor
(workers/preempt.py), the moves between pools (workers/rebalance.py), the adapter
watcher, the webhook sender and the metrics server.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import NoReturn

import redis
from celery import Celery
from prometheus_client import start_http_server

from tokenq.shared import tracing
from tokenq.shared.celery_app import create_celery
from tokenq.shared.metrics import WorkerMetrics
from tokenq.shared.redis_conn import block_limit_s
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.store import JobStore
from tokenq.shared.weights import select_backend
from tokenq.workers.cancels import CancelWatcher
from tokenq.workers.drain import Drainer
from tokenq.workers.engines.base import Engine
from tokenq.workers.heartbeat import Heartbeat, advertised_metrics_host
from tokenq.workers.leases import Leases
from tokenq.workers.lora_watcher import MAX_BLOCK_S, AdapterWatcher
from tokenq.workers.pace import PaceMeter
from tokenq.workers.preempt import Preemptor
from tokenq.workers.publisher import Publisher
from tokenq.workers.rebalance import Rebalancer
from tokenq.workers.reconciler import Reconciler
from tokenq.workers.webhooks import WebhookSender

log = logging.getLogger(__name__)

EXIT_REDIS_GONE = 3  # the exit code of a worker that gave up on Redis (redis_give_up_s)
EXIT_GRACE_S = 60.0  # after Celery stopped, the process ends within this (exit_if_still_alive)

_APP_ATTR = "tokenq_runtime"


@dataclass
class WorkerRuntime:
    settings: Settings
    model: str
    cfg: ModelConfig
    engine: Engine
    r: redis.Redis
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    engine_dead: threading.Event = field(default_factory=threading.Event)
    # The queues' name: the model, or `model@pool` for one pool of a model served by
    # several (placement: docs/scheduling.md).
    pool: str = ""
    pools: list[str] = field(default_factory=list)  # the model's pool ids, when several

    def __post_init__(self) -> None:
        s = self.settings
        self.pool = self.pool or self.model
        self.store = JobStore(self.r, s)
        self.publisher = Publisher(self.store, on_cancel=self.engine.cancel)
        self.cancels = CancelWatcher(self.r, self.engine.cancel)
        self.metrics = WorkerMetrics()
        self.pace = PaceMeter()
        self.celery = create_celery(s)
        self.webhooks = WebhookSender(self.r, s, self.worker_id)
        self.adapters = AdapterWatcher(self.r, self.engine, self.model, self.worker_id,
                                       s.adapter_poll_s, block_limit_s(self.r, MAX_BLOCK_S))
        self.reconciler = Reconciler(self.store, s, self.celery)
        self.drainer = Drainer(self.store, s, celery=self.celery,
                               publisher=self.publisher, engine=self.engine, model=self.pool,
                               worker_id=self.worker_id)
        self.preemptor = Preemptor(self.store, s, celery=self.celery, publisher=self.publisher,
                                   engine=self.engine, model=self.pool,
                                   worker_id=self.worker_id, metrics=self.metrics)
        self.rebalancer = Rebalancer(self.store, s, celery=self.celery,
                                     publisher=self.publisher, engine=self.engine,
                                     pool=self.pool, pools=self.pools,
                                     backend=select_backend(self.cfg))
        self.heartbeat = Heartbeat(
            r=self.r, settings=s, worker_id=self.worker_id, model=self.model, pool=self.pool,
            engine=self.engine,
            adapters=self.adapters, metrics=self.metrics, pace=self.pace,
            leases=Leases(self.store, self.publisher, self.engine, self.worker_id),
            reconciler=self.reconciler, on_engine_died=self._engine_died,
            on_redis_gone=self._redis_gone)

    def start(self) -> None:
        s = self.settings
        tracing.setup(s.tracing, "tokenq-worker")
        if s.worker.metrics_port is not None:
            server, _ = start_http_server(s.worker.metrics_port, addr=s.worker.metrics_addr,
                                          registry=self.metrics.registry)
            self.heartbeat.metrics_port = int(server.server_port)
            self.heartbeat.metrics_host = advertised_metrics_host(s)
            self.heartbeat.bound_to_all = not s.worker.metrics_host and \
                s.worker.metrics_addr in ("", "0.0.0.0", "::")
        self.publisher.start()
        self.engine.start(self.publisher.sink)
        self.cancels.start()
        self.adapters.start()
        self.heartbeat.start()
        if not self.cfg.embedding:  # embeddings are one step each: nothing to preempt
            self.preemptor.start()
        self.rebalancer.start()
        self.webhooks.start()
        log.info("worker %s serving %s on %s (%d slots)", self.worker_id, self.pool,
                 self.engine.backend, self.engine.slots)

    def close(self) -> None:
        self.heartbeat.stop()
        self.cancels.stop()
        self.preemptor.stop()
        self.rebalancer.stop()
        self.adapters.stop()
        self.webhooks.stop()
        self.engine.close()
        self.publisher.stop()
        try:
            self.heartbeat.forget()
        except redis.RedisError:
            pass

    def drain(self) -> None:
        self.rebalancer.stop()  # a worker on its way out takes no other pool's jobs
        self.drainer.drain()

    def _redis_gone(self, gone_s: float) -> None:
        """Redis unreachable for longer than worker.redis_give_up_s: exit with code
        EXIT_REDIS_GONE at once (a warm shutdown would wait on writes that cannot happen).
        The jobs' leases have expired meanwhile; whichever worker reaches Redis takes them."""
        log.critical("worker %s: Redis unreachable for %.0f s (worker.redis_give_up_s=%.0f); "
                     "exiting with code %d so the supervisor decides", self.worker_id, gone_s,
                     self.settings.worker.redis_give_up_s, EXIT_REDIS_GONE)
        logging.shutdown()
        os._exit(EXIT_REDIS_GONE)

    def _engine_died(self) -> None:
        """The engine cannot serve again: leave /ready at once (no more heartbeats), let the
        task threads hand their jobs back, and stop the process so a supervisor starts a
        fresh one (`tokenq up` restarts workers; in k8s the pod restarts)."""
        for job_id, attempt in self.heartbeat.stalled_grammars():
            log.error("job %s: llama.cpp has applied its grammar for over %.0f s; failing it "
                      "as poison", job_id, self.settings.worker.grammar_stall_s)
            try:  # the next acquire fails it, not retried (leasing.lua, `grammar_probe`)
                self.store.mark_grammar(job_id, attempt)
            except redis.RedisError:
                log.exception("job %s: grammar mark not written", job_id)
        log.error("worker %s: the %s engine died or stalled; leaving the pool", self.worker_id,
                  self.engine.backend)
        self.engine_dead.set()
        self.publisher.wake_all()  # each task thread hands its job back
        try:
            self.heartbeat.forget()
        except redis.RedisError:
            log.exception("could not remove the heartbeat")
        os.kill(os.getpid(), signal.SIGTERM)  # Celery warm shutdown: stop consuming


def exit_if_still_alive(exitcode: int, after_s: float = EXIT_GRACE_S) -> None:
    """Celery's worker has stopped (a warm shutdown, or its consumer's "Unrecoverable
    error"): the process must end, so its supervisor restarts it. A thread that does not
    let go (a library's non-daemon thread, an engine stuck in C) would keep it alive and
    consuming nothing; after `after_s` this daemon timer ends it with Celery's exit code."""
    def _end() -> None:
        log.error("worker: still alive %.0f s after Celery stopped; exiting with code %d",
                  after_s, exitcode)
        logging.shutdown()
        os._exit(exitcode)

    t = threading.Timer(after_s, _end)
    t.daemon = True
    t.start()


def end_process(status: object) -> NoReturn:
    """End the worker process once Celery has stopped and the runtime is closed, with
    `status` as `SystemExit` reads it (None: 0, an int: itself, anything else: printed to
    stderr, then 1). The interpreter's teardown of its objects and modules is skipped: it
    frees only what the exit returns anyway, and after vLLM's imports (torch,
    transformers) it took ~3.5 s of CPU on a 2-core machine, on every rollout and
    scale-in. What it would have done that matters is done here: a child process still
    running (an engine's, if its stop failed) is killed rather than left behind, the
    `atexit` hooks run (the logs' flush, OpenTelemetry's last spans, multiprocessing's
    clean-up), and the standard streams are flushed."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    for child in multiprocessing.active_children():
        child.kill()
        child.join(5)
    atexit._run_exitfuncs()  # what a normal exit runs first; each hook's error is printed
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def bind(app: Celery, rt: WorkerRuntime | None) -> None:
    """Make `rt` the runtime the app's tasks run on (None: unbind at shutdown)."""
    setattr(app, _APP_ATTR, rt)


def runtime_of(app: Celery) -> WorkerRuntime | None:
    rt = getattr(app, _APP_ATTR, None)
    return rt if isinstance(rt, WorkerRuntime) else None
