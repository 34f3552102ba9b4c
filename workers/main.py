"""Worker entry: a Celery worker (threads pool) that owns exactly one engine and one model.

The engine is built in Celery's `worker_init` hook (before the consumer takes
a message) and closed in `worker_shutdown`; nothing heavy happens at import.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import redis
from celery import signals
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from shared import keys
from shared.celery_app import (
    GENERATE_TASK,
    create_celery,
    tolerate_acks_after_connection_loss,
)
from shared.models import gguf_path, select_backend
from shared.settings import Settings
from workers import tasks
from workers.engines.base import Engine

log = logging.getLogger(__name__)


def build_engine(settings: Settings, model: str) -> Engine:
    cfg = settings.models()[model]
    backend = select_backend(cfg)
    if backend == "llama":
        from workers.engines.llamacpp import LlamaCppEngine

        if settings.worker_threads:
            cfg = cfg.model_copy(update={"n_threads": settings.worker_threads})
        return LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    if backend == "fake":
        from workers.engines.fake import FakeEngine

        return FakeEngine(cfg)
    raise SystemExit(f"backend {backend!r} for model {model!r} cannot run in this worker yet")


def run_worker(settings: Settings, model: str, loglevel: str = "INFO") -> None:
    if model not in settings.models():
        raise SystemExit(f"unknown model {model!r}; known: {', '.join(settings.models())}")
    app = create_celery(settings)
    tolerate_acks_after_connection_loss()
    app.task(name=GENERATE_TASK, acks_late=True, ignore_result=True)(tasks.generate)
    cfg = settings.models()[model]

    @signals.worker_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _start(**_: Any) -> None:
        # Retry on a fresh connection after a Redis restart (the pool's are dead then).
        r = redis.Redis.from_url(
            settings.require_redis_url(), decode_responses=True,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError])
        rt = tasks.WorkerRuntime(settings=settings, model=model, cfg=cfg,
                                 engine=build_engine(settings, model), r=r)
        rt.start()
        tasks.set_runtime(rt)

    @signals.worker_shutting_down.connect(weak=False)  # type: ignore[untyped-decorator]
    def _drain(**_: Any) -> None:
        rt = tasks._runtime
        if rt is not None:
            rt.drain()

    @signals.worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _stop(**_: Any) -> None:
        rt = tasks._runtime
        if rt is not None:
            rt.close()
            tasks.set_runtime(None)

    slots = cfg.n_parallel if select_backend(cfg) in ("llama", "fake") else cfg.max_num_seqs
    app.worker_main([
        "worker", "--pool=threads", f"--concurrency={slots}",
        "-Q", ",".join(keys.model_queues(model)),
        "-n", f"{model}@{socket.gethostname()}-{os.getpid()}",
        f"--loglevel={loglevel}", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])
