"""Job logic behind the routes: validate, enqueue, read, cancel, stream.

Where a job is enqueued: `submit` -> `enqueue` -> the job store's `create`
(shared/lua/create.lua), which writes the record, the Celery message and the `queued`
event in one atomic step.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from tokenq.api import durable, idempotency, lora_admin, placement, streams
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    ContextLengthExceeded,
    Draining,
    Forbidden,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    QueueFull,
)
from tokenq.api.idempotency import Idem
from tokenq.api.openai.tools import checked_constraint, template_of
from tokenq.api.openai.tools import plan as tool_plan
from tokenq.api.openai.tools import render as render_tools
from tokenq.api.openai.tools import validate as validate_tools
from tokenq.shared import jobs, keys, logs, schema_budget, tracing, webhook_policy
from tokenq.shared.celery_app import ticket_message
from tokenq.shared.jobs import dumps
from tokenq.shared.schema_budget import GrammarBudget, SchemaOverBudget, nesting
from tokenq.shared.schemas import (
    TERMINAL_STATES,
    JobAccepted,
    JobRecord,
    JobRequest,
    JobSpec,
    ResponseFormat,
    SamplingParams,
)
from tokenq.shared.settings import ModelConfig
from tokenq.shared.weights import select_backend

MAX_STOP_LEN = 64
# A response_format schema nested deeper than this is refused (400) before anything is
# built from it: validators and grammar builders recurse over it.
MAX_SCHEMA_DEPTH = 32
log = logging.getLogger("tokenq.jobs")


def new_job_id() -> str:
    return "job_" + uuid.uuid4().hex


def resolve_params(req: JobRequest, cfg: ModelConfig, max_tokens_limit: int,
                   max_stops: int, budget: GrammarBudget | None = None) -> SamplingParams:
    stops = req.stop_list()
    if len(stops) > max_stops:
        raise InvalidRequest(f"at most {max_stops} stop sequences", param="stop")
    if any(not s or len(s) > MAX_STOP_LEN for s in stops):
        raise InvalidRequest(f"stop sequences must be 1..{MAX_STOP_LEN} characters", param="stop")
    max_tokens = req.max_tokens if req.max_tokens is not None else cfg.max_tokens
    if max_tokens > max_tokens_limit:
        raise InvalidRequest(f"max_tokens must be <= {max_tokens_limit}", param="max_tokens")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=cfg.temperature if req.temperature is None else req.temperature,
        top_p=cfg.top_p if req.top_p is None else req.top_p,
        top_k=cfg.top_k if req.top_k is None else req.top_k,
        repetition_penalty=(cfg.repeat_penalty if req.repetition_penalty is None
                            else req.repetition_penalty),
        stop=[*stops, *(s for s in cfg.stop if s not in stops)],
        seed=req.seed,
        min_p=cfg.min_p if req.min_p is None else req.min_p,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
        logprobs=req.logprobs,
        json_schema=json_schema_of(req.response_format, budget),
        cache_prompt=req.cache_prompt is not False,
    )


def json_schema_of(fmt: ResponseFormat | None,
                   budget: GrammarBudget | None = None) -> dict[str, Any] | None:
    """OpenAI's response_format -> the JSON schema engines constrain decoding to. Every
    schema (jobs, chat, completions, batch lines) passes here: over the grammar budgets
    (shared/schema_budget.py) it is a 400 before anything is enqueued."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    spec = fmt.json_schema or {}
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest("response_format.json_schema.schema must be a JSON schema object",
                             param="response_format")
    try:
        schema_budget.estimate(schema, budget or GrammarBudget())
    except SchemaOverBudget as exc:
        raise InvalidRequest(f"response_format.json_schema.schema is over this server's "
                             f"grammar budget at {exc.path}: {exc}", param="response_format",
                             code="schema_too_complex") from exc
    # Even with the budgets lifted: the meta-schema validator recurses.
    if nesting(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(f"response_format.json_schema.schema is nested more than "
                             f"{MAX_SCHEMA_DEPTH} deep", param="response_format",
                             code="schema_too_complex")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidRequest(f"response_format.json_schema.schema is not a valid JSON schema: "
                             f"{exc.message}", param="response_format") from exc
    return schema


async def check_webhook_url(state: AppState, url: str) -> str:
    """A webhook URL the workers may send to (shared/webhook_policy.py), else a 400; the
    workers check it again when they send."""
    try:
        await webhook_policy.resolve(webhook_policy.AddressPolicy(
            state.settings.webhook_allow_hosts), url)
    except webhook_policy.UnsafeWebhook as exc:
        raise InvalidRequest(str(exc), param="metadata.webhook_url",
                             code="invalid_webhook_url") from exc
    return url


@dataclass(slots=True)
class Prepared:
    """A validated request, ready to enqueue: the record fields and its queue."""

    model: str
    priority: str
    n_prompt: int
    fields: dict[str, str]
    max_tokens: int = 0
    # placement (api/placement.py): the pool the request pins, its first-token budget,
    # and the pool's id once placed ('' until then: the model's own queues)
    pin: str | None = None
    budget_ms: int | None = None
    pool: str = ""


async def prepare(state: AppState, tenant: str, req: JobRequest) -> Prepared:
    """Everything that can reject a request (model, sampling limits, schema, context length),
    without writing anything. Batch validation runs this for every line first."""
    s = state.settings
    if req.priority == "high" and not state.may_use_high(tenant):
        raise Forbidden("priority 'high' needs an API key with the `high` role; use "
                        "'normal' or ask the operator", param="priority")
    validate_tools(req)
    base, adapter = req.model, None
    cfg = state.models.get(req.model)
    if cfg is None:
        # `model` may name a LoRA adapter: the job runs on its base model's queue with the
        # adapter's current version pinned in the spec (a later unload or rollback does
        # not change what this job runs on).
        found = await lora_admin.resolve(state, req.model, tenant)
        if found is None:
            raise ModelNotFound(f"model {req.model!r} is not served here", param="model")
        base, adapter = found
        cfg = state.models[base]
    if cfg.embedding != (req.input is not None):
        raise InvalidRequest(
            f"model {req.model!r} is an embedding model: use /v1/embeddings" if cfg.embedding
            else f"model {req.model!r} does not make embeddings", param="model")
    params = resolve_params(req, cfg, s.api.max_tokens_limit, s.api.max_stop_sequences,
                            schema_budget.budget_of(s))
    pin = placement.check_pin(base, cfg, req.backend)
    backend = select_backend(cfg)
    context = cfg.context_length(backend)
    if req.input is not None:
        return await _prepare_embedding(state, tenant, req, base, cfg, context, params)
    if params.max_tokens >= context:
        raise ContextLengthExceeded(
            f"max_tokens={params.max_tokens} does not fit this model's context of {context}",
            param="max_tokens")
    messages = await state.counter.plain_messages(tenant, req.messages)
    tools = None
    plan = tool_plan(req, cfg, await template_of(state, base, cfg)) if messages else None
    if plan is not None and messages is not None:
        messages, tools = render_tools(plan, messages)
        params.json_schema = checked_constraint(plan, schema_budget.budget_of(s)) \
            or params.json_schema
    try:
        n_prompt = await state.counter.count(base, cfg, req.prompt, messages, tools,
                                             tenant=tenant)
    except QueueFull:
        raise  # the CPU pool's 429
    except Exception as exc:
        raise InvalidRequest(f"could not apply the chat template: {exc}",
                             param="messages") from exc
    n_vocab = await state.counter.n_vocab(base, cfg)
    if params.logit_bias and n_vocab is not None and max(params.logit_bias) >= n_vocab:
        raise InvalidRequest(f"logit_bias: token ids are below this model's vocabulary size "
                             f"{n_vocab}", param="logit_bias")
    if n_prompt + params.max_tokens > context:
        raise ContextLengthExceeded(
            f"this model's context is {context} tokens; the prompt has {n_prompt} and "
            f"max_tokens is {params.max_tokens}; shorten the prompt or lower max_tokens",
            param="messages" if messages is not None else "prompt")
    spec = JobSpec(prompt=req.prompt, messages=messages, params=params,
                   adapter=adapter, tools=tools)
    # `model` stays the base model: workers and the rescue paths route by it.
    fields = {
        "owner": tenant, "model": base, "backend": backend, "priority": req.priority,
        "state": "queued", "attempts": "0", "request": stored_request(req),
        "spec": spec.model_dump_json(), "prompt_tokens": str(n_prompt),
    }
    if req.metadata:
        fields["metadata"] = dumps(req.metadata)
        if req.metadata.get("webhook_url"):
            fields["webhook_url"] = await check_webhook_url(state, req.metadata["webhook_url"])
    if plan is not None:
        fields["tool_format"] = plan.fmt
    if adapter is not None:
        fields["adapter"] = adapter.name
        fields["adapter_version"] = str(adapter.id)
    return Prepared(base, req.priority, n_prompt, fields, params.max_tokens, pin,
                    req.ttft_budget_ms)


def stored_request(req: JobRequest) -> str:
    """The request as the record keeps it. A response schema is stored once, in the spec
    (the engines read it there); JobRecord.from_hash puts it back into `request`."""
    out = req.model_dump(exclude_none=True)
    fmt = out.get("response_format")
    if fmt and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        fmt["json_schema"].pop("schema", None)
    return dumps(out)


async def _prepare_embedding(state: AppState, tenant: str, req: JobRequest, base: str,
                             cfg: ModelConfig, context: int, params: SamplingParams) -> Prepared:
    """Every input must fit the model's context on its own (inputs are not truncated)."""
    assert req.input is not None
    n_prompt = 0
    for i, text in enumerate(req.input):
        n = await state.counter.count(base, cfg, text, None, tenant=tenant)
        if n > context or not text:
            raise ContextLengthExceeded(
                f"input[{i}] has {n} tokens; this model takes 1 to {context} per input",
                param="input")
        n_prompt += n
    spec = JobSpec(inputs=req.input, params=params)
    fields = {"owner": tenant, "model": base, "backend": select_backend(cfg),
              "priority": req.priority, "state": "queued", "attempts": "0",
              "request": dumps({"model": req.model, "input_count": len(req.input)}),
              "spec": spec.model_dump_json(), "prompt_tokens": str(n_prompt)}
    return Prepared(base, req.priority, n_prompt, fields, 0)


def new_job(state: AppState, tenant: str, p: Prepared, *, job_id: str | None = None,
            deadline: float | None = None, extra: dict[str, str] | None = None) -> jobs.NewJob:
    """A prepared request as the store creates it: its record's fields, its queue and its
    Celery message (`enqueue`; the batch driver, a chunk of lines at a time)."""
    job_id = job_id or new_job_id()
    now = time.time()
    # fair share (docs/scheduling.md): its tenant's weight, and the charge when it is taken
    fields = {**p.fields, "id": job_id, "created_at": repr(now), "weight": repr(weight_of(
        state, tenant)), "est_tokens": str(p.n_prompt + p.max_tokens), **(extra or {})}
    if deadline is not None:
        fields["deadline"] = repr(deadline)
    queue = keys.queue(p.pool or p.model, p.priority)
    return jobs.NewJob(job_id, fields, tenant, queue, ticket_message(state.celery, queue), now)


async def place(state: AppState, p: Prepared) -> None:
    """Choose the pool a prepared job waits in (a model served by several; a first-token
    budget): api/placement.py. Its create must follow, or `placement.release`."""
    cfg = state.models.get(p.model)
    if cfg is not None and p.fields.get("model"):
        p.pool = await placement.place(
            state, p.model, cfg, p.fields, priority=p.priority, n_prompt=p.n_prompt,
            max_tokens=p.max_tokens, pin=p.pin, budget_ms=p.budget_ms)


def weight_of(state: AppState, tenant: str) -> float:
    """The tenant's fair-share weight: its key entries' (api/auth.py checks they agree)."""
    return next((p.weight for p in state.api_keys.values() if p.tenant == tenant), 1.0)


async def enqueue(state: AppState, tenant: str, p: Prepared, *, job_id: str | None = None,
                  deadline: float | None = None, extra: dict[str, str] | None = None,
                  queue_limit: int | None = None, tenant_limit: int = 0, idem: Idem | None = None,
                  acked: bool = False) -> tuple[jobs.CreateResult, str, float]:
    """Record + Celery message + `queued` event in one atomic step: (what the store
    answered, the job id, its created_at). With an Idempotency-Key the store may answer
    with the key's earlier job (`Replayed`, `KeyReused`): the id returned is then that
    job's. `acked`: a client waits for this answer: durable acceptance (api/durable.py)."""
    await place(state, p)
    job = new_job(state, tenant, p, job_id=job_id, deadline=deadline, extra=extra)
    idem_key = None if idem is None else jobs.IdemKey(idem.redis_key, idem.body_sha,
                                                      state.settings.api.idempotency_ttl_s)
    try:
        created = await durable.create(state, job.job_id, job.fields, tenant=tenant,
                                       queue=job.queue, message=job.message,
                                       queue_limit=queue_limit, tenant_limit=tenant_limit,
                                       now=job.now, idem=idem_key, durable=acked)
    except BaseException:
        if p.fields.get("pool"):  # not created (or not known to be): counted no longer
            await asyncio.shield(placement.release(state, p.fields["pool"]))
        raise
    if p.fields.get("pool") and not isinstance(created, jobs.Created):
        await placement.release(state, p.fields["pool"])
    if isinstance(created, jobs.Replayed | jobs.KeyReused):
        return created, created.job_id, job.now
    return created, job.job_id, job.now


async def submit(state: AppState, tenant: str, req: JobRequest, *,
                 deadline: float | None = None,
                 extra: dict[str, str] | None = None) -> JobAccepted:
    """Validate and enqueue one request (native jobs and OpenAI chat/completions)."""
    accepted, _ = await submit_once(state, tenant, req, None, deadline=deadline, extra=extra)
    return accepted


async def replayed(state: AppState, job_id: str, req: JobRequest) -> JobAccepted | None:
    """The accepted answer of the Idempotency-Key's job, as it stands now (None: gone)."""
    st, created = await state.redis.hmget(keys.job(job_id), ["state", "created_at"])
    if st is None or created is None:
        return None
    return JobAccepted(id=job_id, model=req.model, status=str(st),  # type: ignore[arg-type]
                       created_at=float(created),
                       stream_url=f"/v1/jobs/{job_id}/events")


async def submit_once(state: AppState, tenant: str, req: JobRequest, idem: Idem | None, *,
                      deadline: float | None = None,
                      extra: dict[str, str] | None = None) -> tuple[JobAccepted, bool]:
    """`submit`, with an Idempotency-Key: (the job, whether it is a replay of an earlier
    request). A replay is answered before validation and rate charges."""
    if idem is not None:
        stored: str | None = await state.redis.get(idem.redis_key)  # type: ignore[assignment]
        if stored is not None:
            job_id, sha = idempotency.split(stored)
            idempotency.check_same_body(idem, sha)
            again = await replayed(state, job_id, req)
            if again is not None:
                await durable.check_replay(state, job_id)
                return again, True
    if state.draining:
        raise Draining("this API replica is shutting down; retry (another replica will serve)")
    with tracing.span("job.submit", **{"tokenq.tenant": tenant, "tokenq.model": req.model}
                      ) as sp, logs.bind(model=req.model):
        accepted = await _submit(state, tenant, req, idem, deadline, extra)
        if sp is not None:
            sp.set_attribute("tokenq.job_id", accepted[0].id)
        log.info("job %s: queued", accepted[0].id, extra={"job_id": accepted[0].id})
        return accepted


async def _submit(state: AppState, tenant: str, req: JobRequest, idem: Idem | None,
                  deadline: float | None,
                  extra: dict[str, str] | None) -> tuple[JobAccepted, bool]:
    p = await prepare(state, tenant, req)
    parent = tracing.traceparent()
    if parent is not None:
        p.fields["traceparent"] = parent
    await state.limits.charge_tokens(tenant, state.settings.api.tokens_per_min,
                                     p.n_prompt + p.max_tokens)
    deadline = deadline if deadline is not None else req.deadline
    created, job_id, now = await enqueue(state, tenant, p, deadline=deadline, extra=extra,
                                         tenant_limit=state.settings.api.tenant_max_queued,
                                         idem=idem, acked=True)
    if isinstance(created, jobs.KeyReused):
        raise idempotency.key_reused()
    if isinstance(created, jobs.Replayed):
        again = await replayed(state, job_id, req)
        if again is not None:
            return again, True
    if isinstance(created, jobs.TenantFull):
        raise QueueFull(f"you have {state.settings.api.tenant_max_queued} jobs queued, the limit "
                        "per tenant; retry when some have started", retry_after=5,
                        code="tenant_queue_full")
    if not isinstance(created, jobs.Created):
        depth = await state.redis.llen(keys.queue(p.pool or p.model, p.priority))
        raise QueueFull(f"the queue for {req.model!r} is full ({depth} jobs); retry later",
                        retry_after=max(1, min(60, int(depth) // 100)))
    return JobAccepted(id=job_id, model=req.model, created_at=now,
                       stream_url=f"/v1/jobs/{job_id}/events", position=created.position,
                       eta_s=created.eta_s), False


async def get(state: AppState, tenant: str, job_id: str) -> JobRecord:
    h: dict[str, str] = await state.redis.hgetall(keys.job(job_id))  # type: ignore[assignment]
    # Another tenant's job is indistinguishable from a missing one.
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no job {job_id!r}", param="job_id")
    if h.get("state") in TERMINAL_STATES and state.settings.api.durable_replicas:
        await durable.settle_terminal(state, f"job {job_id}")
    return JobRecord.from_hash(h)


async def check_owner(state: AppState, tenant: str, job_id: str) -> None:
    """404 unless the job exists and is the tenant's: one field, not the whole record (which
    holds the prompt twice and the output)."""
    if await state.redis.hget(keys.job(job_id), "owner") != tenant:
        raise NotFound(f"no job {job_id!r}", param="job_id")


async def cancel(state: AppState, tenant: str, job_id: str, wait_s: float = 2.0) -> JobRecord:
    """Cancel; idempotent. Waits briefly for a running job's engine to let go."""
    await check_owner(state, tenant, job_id)
    if await state.jobs.cancel(job_id) is jobs.Cancelled.REQUESTED:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await state.redis.hget(keys.job(job_id), "state") != "running":
                break
            await asyncio.sleep(0.05)
    return await get(state, tenant, job_id)


async def resume_point(state: AppState, job_id: str, after: str) -> str | None:
    """Where a resume with Last-Event-ID `after` starts (api/streams.py resume_point)."""
    return await streams.resume_point(state.redis, keys.job_events(job_id), after)


async def events(state: AppState, job_id: str,
                 after: str | None) -> AsyncIterator[tuple[str, str, str]]:
    """(id, event, data JSON) for each stream entry after `after`, to the terminal event.
    The data is relayed as the worker wrote it: no parse and re-encode per token."""
    async for entry_id, fields in state.hub.subscribe(keys.job_events(job_id), after):
        yield entry_id, fields["e"], fields["d"]
