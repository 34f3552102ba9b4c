"""create_app(settings): lifespan (Redis pool, stream hub), routers, error handlers."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tokenq.api import durable, errors, models_admin
from tokenq.api.access_log import AccessLog
from tokenq.api.auth import KeyAuth, Principal, keys_from_env, load_keys
from tokenq.api.deps import AppState
from tokenq.api.limits import BodyLimit
from tokenq.api.openai.batch_driver import BatchDriver
from tokenq.api.openai.file_store import FileStore
from tokenq.api.ratelimit import RateLimits
from tokenq.api.routes import (
    admin,
    batches,
    files,
    jobs,
    lora,
    models,
    openai,
    ops,
    playground,
    tokenize,
)
from tokenq.api.streams import StreamHub, hub_client
from tokenq.api.tokens import PromptCounter
from tokenq.shared import aio, tracing
from tokenq.shared.celery_app import create_celery
from tokenq.shared.redis_conn import async_client
from tokenq.shared.settings import NO_REDIS_URL, Settings, SettingsProblem, get_settings
from tokenq.shared.settings_load import load_settings
from tokenq.shared.store import AsyncJobStore

GC_THRESHOLDS = (20_000, 10, 10)  # Python's default: (700, 10, 10)

log = logging.getLogger("tokenq.api")


def create_app(settings: Settings | None = None, api_keys: str | None = None,
               keys: dict[str, Principal] | None = None) -> FastAPI:
    """`api_keys`: TOKENQ_API_KEYS's form, read with the settings' keys file; `keys`: those
    already read (app_from_env)."""
    settings = settings or get_settings()
    api_key_map = keys if keys is not None else load_keys(api_keys, settings.api.keys_file)
    if settings.env == "production" and not api_key_map:
        # Without keys every caller would be the admin tenant: refuse, loudly, rather
        # than serve (or quietly hide on loopback where no probe or proxy reaches it).
        raise SystemExit("TOKENQ_ENV=production needs API keys: set TOKENQ_API__KEYS_FILE "
                         "(lines of 'sha256:<hex> tenant [admin]'; `tokenq hash-key KEY`) "
                         "or TOKENQ_API_KEYS")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # After a Redis restart every pooled connection is dead: retry a command on a fresh
        # one (briefly) rather than answer the first requests with 503.
        r = async_client(
            settings, decode_responses=True, max_connections=256, health_check_interval=30,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            retry_on_error=[RedisConnectionError, RedisTimeoutError])
        tracing.setup(settings.tracing, "tokenq-api")
        hub_redis = hub_client(settings, settings.api.stream_block_ms)
        hub = StreamHub(hub_redis, block_ms=settings.api.stream_block_ms,
                        read_gap_ms=settings.api.stream_read_gap_ms,
                        notify=settings.api.stream_notify,
                        full_read_ms=settings.api.stream_full_read_ms)
        await hub.start()
        state = AppState(
            settings=settings, redis=r, hub=hub, celery=create_celery(settings),
            models=settings.models(), counter=PromptCounter(settings),
            jobs=AsyncJobStore(r, settings), limits=RateLimits(r), api_keys=api_key_map,
        )
        state.redis_raw = async_client(settings, decode_responses=False, max_connections=32)
        if settings.api.durable_replicas:  # endings reach clients only once replicated
            hub.before_terminal = partial(durable.settle_terminal, state)
        state.file_store = FileStore(r, settings.api.files_dir)
        sweeper_stop = asyncio.Event()
        sweeper = asyncio.create_task(state.file_store.run(sweeper_stop),
                                      name="tokenq-upload-sweeper")
        driver = BatchDriver(state)
        state.background["batch_wake"] = driver.wake
        state.background["batch_nudge"] = driver.nudge
        driver_task = asyncio.create_task(driver.run(), name="tokenq-batch-driver")
        stop_catalogue = models_admin.start(state)  # state.models follows it
        # Vocabularies now, in the background, so the first request does not wait for one.
        preload = asyncio.create_task(state.counter.preload(state.models),
                                      name="tokenq-vocab-preload")
        # The SSE fan-out's p99 was the cyclic collector (`tokenq bench --scale`,
        # docs/benchmarks.md): what start-up built lives as long as the process, so it is
        # frozen out of the collector's sight, and collections run less often: a young one
        # every 20,000 net allocations rather than 700, the older ones in proportion.
        gc.freeze()
        preload.add_done_callback(lambda _: gc.freeze())
        gc.set_threshold(*GC_THRESHOLDS)
        app.state.tokenq = state
        if settings.env == "production" and settings.api.files_dir is None:
            log.warning("uploaded files are kept in Redis' memory: set TOKENQ_API__FILES_DIR to a "
                        "directory every API replica shares (per-tenant quotas: "
                        "TOKENQ_API__TENANT_MAX_FILES, TOKENQ_API__TENANT_MAX_FILE_BYTES)")
        if not state.api_keys:
            log.warning("no API keys configured: every caller is tenant 'default' (admin); "
                        "requests that arrive on an address outside loopback are refused "
                        "with 403")
        try:
            yield
        finally:
            preload.cancel()
            await stop_catalogue()
            driver.stop()
            sweeper_stop.set()
            await aio.stop(driver_task, 5)
            await aio.stop(sweeper, 5)
            await hub.stop()
            await hub_redis.aclose()
            await state.raw.aclose()
            await r.aclose()

    app = FastAPI(title="tokenq", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.api_keys_configured = bool(api_key_map)
    errors.install(app)
    app.include_router(jobs.router)
    app.include_router(openai.router)
    app.include_router(tokenize.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(lora.router)
    app.include_router(models.router)
    if settings.api.playground:
        app.include_router(playground.router)
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes,
                       large={"/v1/files": settings.api.max_file_bytes},
                       timeout_s=settings.api.body_timeout_s)
    # Outermost: a request without a valid key is refused before its body is read.
    app.add_middleware(KeyAuth, keys=api_key_map)
    if settings.api.access_log:
        app.add_middleware(AccessLog)
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory: `uvicorn tokenq.api.app:app_from_env --factory` (and what
    `python -m tokenq.api.server` serves). A wrong setting or API key entry, or no
    TOKENQ_REDIS_URL, stops the process at once with one line naming it (exit 1), as the
    command line does, rather than a traceback at start or at uvicorn's startup."""
    try:
        settings = load_settings()
        if not settings.redis_url:
            raise SettingsProblem(NO_REDIS_URL)
        keys = keys_from_env(settings)
    except SettingsProblem as exc:
        raise SystemExit(f"tokenq: {exc}") from None
    return create_app(settings, keys=keys)
