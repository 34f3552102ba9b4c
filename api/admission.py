"""Admission: everything that can refuse a request before it is enqueued (the model, the
caller's rights, sampling limits, the response schema, tools, the context length), with
nothing written; what passes is a `Prepared` job, its record's fields ready
(api/service.py enqueues it). Batch validation runs this for every line first.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from jsonschema.exceptions import SchemaError

from tokenq.api import lora_admin, placement
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    ContextLengthExceeded,
    Forbidden,
    InvalidRequest,
    ModelNotFound,
    QueueFull,
)
from tokenq.api.openai.tools import checked_constraint, template_of
from tokenq.api.openai.tools import compact as compact_plan
from tokenq.api.openai.tools import plan as tool_plan
from tokenq.api.openai.tools import render as render_tools
from tokenq.api.openai.tools import validate as validate_tools
from tokenq.shared import schema_budget, schema_keywords, schema_meta, webhook_policy
from tokenq.shared.jobs import dumps
from tokenq.shared.json_grammar import schema_gbnf
from tokenq.shared.schema_budget import GrammarBudget, SchemaOverBudget, nesting
from tokenq.shared.schema_keywords import SchemaRefused
from tokenq.shared.schemas import (
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
        schema_meta.check(schema)  # the walk, off the loop for a heavy request
    except SchemaError as exc:
        raise InvalidRequest(f"response_format.json_schema.schema is not a valid JSON schema: "
                             f"{exc.message}", param="response_format") from exc
    try:
        schema_keywords.check(schema, strict=spec.get("strict") is True)
    except SchemaRefused as exc:
        raise InvalidRequest(f"response_format.json_schema.schema at {exc.path}: {exc}",
                             param="response_format") from exc
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
    inputs: int = 0  # an embeddings request's texts


async def prepare(state: AppState, tenant: str, req: JobRequest) -> Prepared:
    """Everything that can reject a request (model, sampling limits, schema, context length),
    without writing anything. Batch validation runs this for every line first."""
    s = state.settings
    if req.priority == "high" and not state.may_use_high(tenant):
        raise Forbidden("priority 'high' needs an API key with the `high` role; use "
                        "'normal' or ask the operator", param="priority")
    fmt = req.response_format
    heavy = schema_meta.heavy(fmt.json_schema if fmt is not None else None,
                              *(t.function.parameters for t in req.tools or []))
    await _maybe_off_loop(state, tenant, heavy, validate_tools, req)
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
    params = await _maybe_off_loop(state, tenant, heavy, resolve_params, req, cfg,
                                   s.api.max_tokens_limit, s.api.max_stop_sequences,
                                   schema_budget.budget_of(s))
    pin = placement.check_pin(base, cfg, req.backend)
    backend = select_backend(cfg)
    context = cfg.context_length(backend)
    if req.input is not None:
        return await _prepare_embedding(state, tenant, req, base, cfg, context, params)
    if req.max_tokens is not None and params.max_tokens >= context:
        raise ContextLengthExceeded(
            f"max_tokens={params.max_tokens} does not fit this model's context of {context}",
            param="max_tokens")
    messages = await state.counter.plain_messages(tenant, req.messages)
    tools = None
    plan = tool_plan(req, cfg, await template_of(state, base, cfg)) if messages else None
    if plan is not None and messages is not None:
        messages, tools = render_tools(plan, messages)
        params.json_schema = await _maybe_off_loop(
            state, tenant, heavy, checked_constraint, plan, schema_budget.budget_of(s)) \
            or params.json_schema
    if params.json_schema is not None and backend == "llama":  # tools' constraint too
        await _check_gbnf(state, tenant, params.json_schema)
    try:
        n_prompt = await state.counter.count(base, cfg, req.prompt, messages, tools,
                                             tenant=tenant)
    except QueueFull:
        raise  # the CPU pool's 429
    except Exception as exc:
        raise InvalidRequest(f"could not apply the chat template: {exc}",
                             param="messages") from exc
    if n_prompt == 0:  # `prompt: ""` on a model that adds no BOS: nothing to decode
        raise InvalidRequest("the prompt is empty: it has no tokens for this model",
                             param="prompt")
    n_vocab = await state.counter.n_vocab(base, cfg)
    if params.logit_bias and n_vocab is not None and max(params.logit_bias) >= n_vocab:
        raise InvalidRequest(f"logit_bias: token ids are below this model's vocabulary size "
                             f"{n_vocab}", param="logit_bias")
    if n_prompt + params.max_tokens > context and req.max_tokens is None and n_prompt < context:
        params.max_tokens = context - n_prompt  # the default, cut to what is left (as vLLM)
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
        fields["tool_format"], fields["tool_plan"] = plan.fmt, compact_plan(plan)
    if adapter is not None:
        fields["adapter"] = adapter.name
        fields["adapter_version"] = str(adapter.id)
    return Prepared(base, req.priority, n_prompt, fields, params.max_tokens, pin,
                    req.ttft_budget_ms)


T = TypeVar("T")


async def _maybe_off_loop(state: AppState, tenant: str, heavy: bool, fn: Callable[..., T],
                          *args: Any) -> T:
    """`fn(*args)` on the CPU pool, in the tenant's share, where the request's schemas are
    heavy (their meta-schema walk: shared/schema_meta.py); on the loop otherwise."""
    return await state.counter.pool.run(tenant, fn, *args) if heavy else fn(*args)


async def _check_gbnf(state: AppState, tenant: str, schema: dict[str, Any]) -> None:
    """A llama.cpp worker turns the schema into a grammar with llama-cpp-python's converter
    (shared/json_grammar.py); what it cannot convert (a pattern without ^...$, a $ref to
    nowhere) is a 400 here, not a job failed on the worker. On the CPU pool: a schema at
    the budgets' edge (900 properties) takes ~0.5 s to convert."""
    try:
        await state.counter.pool.run(tenant, schema_gbnf, schema)
    except ValueError as exc:
        raise InvalidRequest(f"response_format.json_schema.schema: {exc}",
                             param="response_format") from exc


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
    return Prepared(base, req.priority, n_prompt, fields, 0, inputs=len(req.input))
