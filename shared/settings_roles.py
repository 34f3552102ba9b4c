"""The settings of one role each, nested in Settings: ``api``, ``worker``, ``autoscale``.

A field lives here when only that role's processes read it; a field read by several roles
stays top level in Settings (shared/settings.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel


class ApiSettings(BaseModel):
    """Read by the API process only: ``TOKENQ_API__<NAME>``."""

    # API keys file: lines of `sha256:<hex> tenant [admin]` (plain keys: TOKENQ_API_KEYS)
    keys_file: Path | None = None

    # limits
    max_body_bytes: int = 1_000_000
    max_tokens_limit: int = 4096
    max_stop_sequences: int = 8
    queue_limit: int = 10_000
    # Per tenant (0 = off). Rates live in Redis, so they hold across API replicas.
    tenant_max_queued: int = 1_000
    rate_limit_rps: float = 0.0
    rate_limit_burst: int = 0  # requests a tenant may send at once (0: 2 x rps)
    tokens_per_min: int = 0  # prompt + max_tokens of submitted jobs
    # Open SSE streams per tenant, counted per API replica.
    max_streams_per_tenant: int = 256
    # A request body must arrive within this (slow-body clients hold a connection).
    body_timeout_s: float = 30.0
    # How long an Idempotency-Key is remembered (POST /v1/jobs, POST /v1/batches).
    idempotency_ttl_s: int = 24 * 3600
    # SIGTERM: refuse new jobs (503) and let open streams finish, at most this long.
    drain_s: float = 30.0

    access_log: bool = True
    # GET /playground: a page to try the API from a browser (static; calls need a key)
    playground: bool = True

    # SSE
    sse_ping_s: float = 15.0
    sse_send_timeout_s: float = 30.0
    # OpenAI chat/completions: a client that disconnects cancels its job (batch lines never).
    cancel_on_disconnect: bool = True

    # files and batches (OpenAI Files/Batch API)
    max_file_bytes: int = 100_000_000
    max_batch_lines: int = 50_000
    # Where uploaded file contents live: None = in Redis (every API replica sees them);
    # a directory must then be shared by all replicas.
    files_dir: Path | None = None
    file_ttl_s: int = 30 * 24 * 3600
    batch_chunk: int = 256  # lines validated/enqueued per Redis round trip


class WorkerSettings(BaseModel):
    """Read by worker processes only: ``TOKENQ_WORKER__<NAME>``."""

    # The model `tokenq worker` serves when --model is not given (else default_model).
    model: str | None = None
    threads: int | None = None

    # leases and recovery
    lease_ttl_s: float = 15.0
    max_attempts: int = 3
    heartbeat_s: float = 2.0
    # How often each worker looks for running jobs whose lease expired (dead workers).
    reconcile_s: float = 2.0
    # A job queued this long whose message is neither queued nor delivered is re-enqueued.
    rescue_after_s: float = 10.0
    # SIGTERM: stop taking jobs, let running ones finish this long, then hand them back.
    drain_grace_s: float = 30.0

    # Each worker serves its engine metrics here (0: a free port; advertised in heartbeats).
    metrics_addr: str = "127.0.0.1"
    metrics_port: int | None = 0
    # The host advertised for it (Prometheus service discovery through the API's
    # /metrics/targets); default: the bound address, or this host's IP if bound to all.
    metrics_host: str | None = None

    # completion webhooks (metadata.webhook_url)
    webhook_secret: str | None = None
    webhook_timeout_s: float = 5.0
    webhook_max_attempts: int = 5


class AutoscaleSettings(BaseModel):
    """Read by the autoscaler only (`tokenq autoscale`, `tokenq up --autoscale`; see
    cli/scaling.py): ``TOKENQ_AUTOSCALE__<NAME>``."""

    min_workers: int = 0
    max_workers: int = 4
    interval_s: float = 2.0
    up_window_s: float = 0.0
    down_window_s: float = 30.0
    cooldown_s: float = 30.0
    target_per_worker: int | None = None  # None: the engine's slots
