"""The settings of one role each, nested in Settings: ``api``, ``worker``, ``autoscale``.

A field lives here when only that role's processes read it; a field read by several roles
stays top level in Settings (shared/settings.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from tokenq.shared.parsing import secret_key


def comma_list(v: Any) -> Any:
    """A setting given as a string: JSON (`[…]`, `{…}`) or comma-separated items."""
    if isinstance(v, str):
        text = v.strip()
        if text.startswith(("[", "{")):
            return json.loads(text)
        return [n.strip() for n in text.split(",") if n.strip()]
    return v


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
    # A request line and headers: at most this many bytes (431), complete within this long
    # of their first byte (408); api/header_limits.py.
    max_header_bytes: int = Field(default=65_536, ge=1_024)
    header_timeout_s: float = Field(default=30.0, gt=0)
    # How long an Idempotency-Key is remembered (POST /v1/jobs, POST /v1/batches).
    idempotency_ttl_s: int = 24 * 3600
    # SIGTERM: refuse new jobs (503) and let open streams finish, at most this long.
    drain_s: float = 30.0
    # Durable acceptance (docs/reliability.md, "Redis failover"): after a job is written,
    # wait (Redis WAIT) until this many replicas have it before answering 202; fewer
    # within durable_timeout_ms is a 503 `not_replicated` (retryable). 0: off (a lone
    # Redis). 1 with Sentinel, so that a failover cannot lose an accepted job.
    durable_replicas: int = Field(default=0, ge=0, le=16)
    durable_timeout_ms: int = Field(default=1000, ge=1, le=60_000)
    # A model with several pools: a replica's jobs reach their lane in the order they were
    # placed (api/placement.py in_order: one placement and create at a time per model and
    # replica; ~45% fewer POST/s for such models, docs/scheduling.md "Order"). Off: faster
    # submits, and a burst's jobs may run in another order than placement counted. Never
    # held with durable_replicas (a WAIT inside it would hold every submit up to its timeout).
    placement_in_order: bool = True

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
    # a directory must then be shared by all replicas. In production set it (compose does,
    # on its shared volume): the API warns at start when uploads would fill Redis' memory.
    files_dir: Path | None = None
    file_ttl_s: int = 30 * 24 * 3600
    batch_chunk: int = 256  # lines validated/enqueued per Redis round trip
    # One line of a batch input file is one request: longer, it is that line's error
    # (`line_too_long`), read past without being held in memory.
    max_batch_line_bytes: int = Field(default=1_000_000, ge=1)
    # Uploaded files per tenant: how many, and their bytes in all (0: no limit). Over it,
    # an upload is refused with 403 `quota_exceeded`.
    tenant_max_files: int = Field(default=1000, ge=0)
    tenant_max_file_bytes: int = Field(default=10_000_000_000, ge=0)
    # The same while uploads live in Redis' memory (no `files_dir`): the lower of the two
    # applies, so that one tenant's uploads cannot fill the memory every job lives in.
    tenant_max_redis_file_bytes: int = Field(default=1_000_000_000, ge=0)
    # With TOKENQ_ENV=production, rate limits are on unless set explicitly (0 turns one
    # off): these replace rate_limit_rps / tokens_per_min's dev default of 0.
    production_rate_limit_rps: float = 20.0
    production_tokens_per_min: int = 1_000_000
    # The shared XREAD of an API replica blocks this long (ms); its own connection's socket
    # timeout is this plus 10 s, so an idle wait ends with Redis' empty reply, not a client
    # timeout.
    stream_block_ms: int = Field(default=5000, ge=100, le=60_000)
    # The shared XREAD walks every watched stream inside Redis at each wake-up: a gap (ms)
    # between two reads bounds that cost for up to this much latency (docs/operations.md).
    stream_read_gap_ms: int = Field(default=0, ge=0, le=1000)
    # Read only the streams whose pub/sub channel announced new entries (the job scripts
    # PUBLISH on each write), and every watched stream once per stream_full_read_ms (what a
    # lost hint, or a worker from before the hints, left behind). False: XREAD BLOCK over
    # every watched stream (stream_block_ms), as before.
    stream_notify: bool = True
    stream_full_read_ms: int = Field(default=1000, ge=50, le=60_000)

    # Budgets on a JSON schema (response_format, job and batch lines, tool parameters)
    # checked before anything is enqueued (shared/schema_budget.py): over one is a 400.
    # llama.cpp segfaults compiling maxLength 20000 (docs/reliability.md); 0 lifts a budget.
    schema_max_repeat: int = Field(default=1000, ge=0)  # min/max Length/Items, regex {m,n}
    schema_max_depth: int = Field(default=32, ge=0)  # nesting of the schema document
    schema_max_nodes: int = Field(default=1000, ge=0)  # objects (subschemas, properties)
    schema_max_enum: int = Field(default=256, ge=0)  # values of one enum
    schema_max_pattern: int = Field(default=512, ge=0)  # characters of one pattern
    schema_max_grammar: int = Field(default=20_000, ge=0)  # estimated grammar size
    # grammar states one `pattern` keeps at once (nested repetitions multiply them)
    schema_max_pattern_states: int = Field(default=256, ge=0)

    # CPU work a request asks of the API (api/cpu.py: /tokenize, /detokenize, rendering and
    # counting a long prompt, parsing a long batch line) runs on cpu_threads threads, not
    # on the event loop; one tenant holds at most cpu_tenant_threads of them, and at most
    # cpu_tenant_queue more of its requests wait for one (beyond: 429 `cpu_busy`).
    # 0: from the cores this process may use (up to 4 threads, half of them a tenant's).
    cpu_threads: int = Field(default=0, ge=0, le=256)
    cpu_tenant_threads: int = Field(default=0, ge=0)
    cpu_tenant_queue: int = Field(default=8, ge=0)
    # /tokenize with return_token_strs: at most this many tokens (a string each); more is
    # a 400 `too_many_token_strs` (the ids alone are still answered without it); 0: no
    # limit.
    max_token_strs: int = Field(default=16_384, ge=0)


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
    # A worker that cannot reach Redis this long (no heartbeat written) exits with code 3,
    # so its supervisor (tokenq up, Kubernetes, compose's restart policy) decides what
    # next; its jobs' leases have expired by then and other workers took them. 0: never.
    redis_give_up_s: float = Field(default=300.0, ge=0)
    # A job's grammar (structured output) that llama.cpp has applied this long without
    # returning has stalled its engine's thread and every job on it: the worker marks that
    # job poison (failed, not retried) and exits, handing the others back. 0: never.
    grammar_stall_s: float = Field(default=60.0, ge=0)

    # Preemption (workers/preempt.py): while a job waits in a higher lane (high over normal
    # over low) and every slot of this worker is taken, running jobs of a lower lane are
    # handed back to their queue (`queued` again, tokens kept) and later continued from
    # their tokens like a takeover, so interactive traffic does not wait behind a batch.
    # A job is preempted at most preempt_max times (then it runs to its end); 0 turns
    # preemption off. The preemptor looks at the lanes when a job is put on one (each
    # script that does so publishes on the lane's name; at most every 10 ms), every
    # preempt_poll_s while jobs wait there or a preemption settles (not while only the
    # lane's own tenant waits, whose jobs hold the slots: nothing to free for it), and
    # every 0.25 s otherwise. At 2, a burst of interactive arrivals found every batch job
    # in a slot at its bound within seconds (docs/benchmarks.md, 2026-11-26 evening); a
    # preempted job resumes first in its lane, with its KV kept in host memory on a
    # llama.cpp worker, so 4 costs little.
    preempt_max: int = Field(default=4, ge=0)
    preempt_poll_s: float = Field(default=0.05, gt=0)
    # The engine then stops the batch's step under way (llama.cpp; computed again next
    # step) and starts no step until the job it preempted for arrives, for at most this
    # long (the time to publish the cancel and fetch that job); 0: no hold, no stop.
    preempt_hold_s: float = Field(default=0.25, ge=0)
    # Fair share (fair_share on): with every slot taken, a running job of a lane is also
    # handed back (within preempt_max) when a job of the same lane waits whose tenant was
    # served less than half as much, weighted, as the running job's tenant; it goes back
    # into its tenant's list and resumes at its tenant's turn (docs/scheduling.md).
    preempt_fair: bool = True
    # The slot thread of a job preempted for a tenant of its lane takes the lane's next job
    # itself (the ticket at the queue's consuming end, as if Celery had delivered it)
    # instead of going back to Celery for a message: the waiting job skips Celery's
    # hand-off, its ack, fetch and dispatch (docs/scheduling.md, "Fair share").
    preempt_take: bool = True
    # Moves between pools (a model served by several: workers/rebalance.py): a worker with
    # a free slot and nothing waiting in its own lanes looks every move_every_s at the
    # model's other pools, and takes a queued job of theirs into its own lane when it is
    # estimated to finish it sooner than that pool would (never a running or pinned job).
    move_queued: bool = True
    move_every_s: float = Field(default=0.25, gt=0)

    # Each worker serves its engine metrics here (0: a free port; advertised in heartbeats).
    metrics_addr: str = "127.0.0.1"
    metrics_port: int | None = 0
    # The host advertised for it (Prometheus service discovery through the API's
    # /metrics/targets); default: the bound address, or this host's IP if bound to all.
    metrics_host: str | None = None

    # completion webhooks (metadata.webhook_url); receivers allowed: webhook_allow_hosts
    # (top level: the API checks it too). webhook_secret is the master secret
    # (`whsec_<base64>`); a tenant's own secret is derived from it and the tenant's name
    # (`tokenq webhook-secret TENANT`) unless webhook_secrets names one:
    # `tenant:whsec_<base64>,…` (or a JSON object).
    webhook_secret: str | None = None
    webhook_secrets: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    webhook_timeout_s: float = 5.0  # each read
    webhook_attempt_s: float = 10.0  # one attempt, connect to last byte, at most this
    webhook_max_response_bytes: int = 65_536  # read of a receiver's answer, then closed
    webhook_senders: int = Field(default=4, ge=1)  # deliveries in flight per worker
    webhook_max_attempts: int = 5

    @field_validator("webhook_secrets", mode="before")
    @classmethod
    def _secrets(cls, v: Any) -> Any:
        got = comma_list(v)
        if isinstance(got, list):  # tenant:secret,…
            return {t.strip(): x.strip() for t, _, x in (i.partition(":") for i in got)}
        return got

    @model_validator(mode="after")
    def _webhook_secrets_are_standard(self) -> WorkerSettings:
        """`whsec_<base64>` (Standard Webhooks), refused at start rather than at send."""

        for name, secret in [("TOKENQ_WORKER__WEBHOOK_SECRET", self.webhook_secret),
                             *((f"TOKENQ_WORKER__WEBHOOK_SECRETS[{t}]", x)
                               for t, x in self.webhook_secrets.items())]:
            if secret:
                try:
                    secret_key(secret)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from exc
        return self


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
