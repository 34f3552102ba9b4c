"""Annotated dependencies the routes take (tests can swap them through app.state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import redis.asyncio as aioredis
from celery import Celery
from fastapi import Depends, Request

from tokenq.api.auth import Principal
from tokenq.api.errors import Forbidden, Unauthorized
from tokenq.api.openai.file_store import FileStore
from tokenq.api.ratelimit import RateLimits
from tokenq.api.streams import StreamHub
from tokenq.api.tokens import PromptCounter
from tokenq.shared import keys
from tokenq.shared.schemas import WorkerHeartbeat, live_workers
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.store import AsyncJobStore


@dataclass
class AppState:
    settings: Settings
    redis: aioredis.Redis
    hub: StreamHub
    celery: Celery
    models: dict[str, ModelConfig]
    counter: PromptCounter
    jobs: AsyncJobStore
    limits: RateLimits
    api_keys: dict[str, Principal] = field(default_factory=dict)  # sha256(key) -> who
    open_streams: dict[str, int] = field(default_factory=dict)  # tenant -> SSE streams here
    draining: bool = False  # SIGTERM received: refuse new jobs, let open streams finish
    # Same server, bytes in and out: file contents (a decoding client could split a
    # multi-byte character at a piece boundary).
    redis_raw: aioredis.Redis | None = None
    background: dict[str, Any] = field(default_factory=dict)  # long-lived tasks (batch driver)
    file_store: FileStore | None = None  # uploads' quotas, leases and expiry (lifespan)

    def may_use_high(self, tenant: str) -> bool:
        """`priority: high` is a per-tenant permission (a key with the `high` or `admin`
        role); without keys (dev) everyone is the admin tenant."""
        return not self.api_keys or any(p.high and p.tenant == tenant
                                         for p in self.api_keys.values())

    @property
    def raw(self) -> aioredis.Redis:
        assert self.redis_raw is not None, "redis_raw is made in the app's lifespan"
        return self.redis_raw

    @property
    def files(self) -> FileStore:
        assert self.file_store is not None, "file_store is made in the app's lifespan"
        return self.file_store

    async def live_workers(self) -> dict[str, WorkerHeartbeat]:
        """The heartbeats of workers that beat within worker_ttl_s, by worker id."""
        raw: dict[str, str] = await self.redis.hgetall(keys.WORKERS)  # type: ignore[assignment]
        return live_workers(raw, self.settings.worker_ttl_s)


# The dependencies are `async def` although none awaits: FastAPI runs a plain `def`
# dependency on a worker thread, a hop per dependency per request.
async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.tokenq
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_principal(request: Request) -> Principal:
    """Who is calling, as api/auth.KeyAuth resolved it for this request."""
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


async def get_tenant(principal: PrincipalDep) -> str:
    """The caller's tenant: from the Bearer key when keys are configured, else `default`."""
    return principal.tenant


TenantDep = Annotated[str, Depends(get_tenant)]


async def require_admin(principal: PrincipalDep) -> Principal:
    """Admin routes (drain, adapters, workers): a key with the `admin` role."""
    if not principal.admin:
        raise Forbidden("this route needs an admin API key")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


async def require_metrics(principal: PrincipalDep) -> Principal:
    """Prometheus' service discovery (workers' addresses): an admin or `metrics` key."""
    if not principal.metrics:
        raise Forbidden("this route needs an admin or metrics API key")
    return principal


MetricsDep = Annotated[Principal, Depends(require_metrics)]
