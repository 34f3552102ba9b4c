"""Annotated dependencies the routes take (tests can swap them through app.state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import redis.asyncio as aioredis
from celery import Celery
from fastapi import Depends, Request

from api.streams import StreamHub
from api.tokens import PromptCounter
from shared.errors import Unauthorized
from shared.metrics import ClusterMetrics
from shared.settings import ModelConfig, Settings

DEFAULT_TENANT = "default"


@dataclass
class AppState:
    settings: Settings
    redis: aioredis.Redis
    hub: StreamHub
    celery: Celery
    models: dict[str, ModelConfig]
    counter: PromptCounter
    api_keys: dict[str, str] = field(default_factory=dict)
    cluster_metrics: ClusterMetrics = field(default_factory=ClusterMetrics)
    draining: bool = False  # SIGTERM received: refuse new jobs, let open streams finish
    scripts: dict[str, Any] = field(default_factory=dict)
    # Same server, bytes in and out: file contents (a decoding client could split a
    # multi-byte character at a piece boundary).
    redis_raw: aioredis.Redis | None = None
    background: dict[str, Any] = field(default_factory=dict)  # long-lived tasks (batch driver)

    @property
    def raw(self) -> aioredis.Redis:
        assert self.redis_raw is not None, "redis_raw is made in the app's lifespan"
        return self.redis_raw


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.tokenq
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_tenant(request: Request, state: StateDep) -> str:
    """The caller's tenant: from the Bearer key when keys are configured, else `default`."""
    if not state.api_keys:
        return DEFAULT_TENANT
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    tenant = state.api_keys.get(token.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
    return tenant


TenantDep = Annotated[str, Depends(get_tenant)]
