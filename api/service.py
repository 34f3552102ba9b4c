"""Job logic behind the routes: validate, enqueue, read, cancel, stream.

Where a job is enqueued: `submit` runs the CREATE script, which writes the
record, the Celery message and the `queued` event in one atomic step.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from api.deps import AppState
from shared import keys
from shared.celery_app import task_message
from shared.errors import (
    ContextLengthExceeded,
    Draining,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    QueueFull,
)
from shared.jobs import dumps
from shared.models import select_backend
from shared.schemas import JobAccepted, JobRecord, JobRequest, SamplingParams
from shared.settings import ModelConfig

MAX_STOP_LEN = 64


def new_job_id() -> str:
    return "job_" + uuid.uuid4().hex


def resolve_params(req: JobRequest, cfg: ModelConfig, max_tokens_limit: int,
                   max_stops: int) -> SamplingParams:
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
    )


async def submit(state: AppState, tenant: str, req: JobRequest,
                 *, deadline: float | None = None) -> JobAccepted:
    s = state.settings
    if state.draining:
        raise Draining("this API replica is shutting down; retry (another replica will serve)")
    cfg = state.models.get(req.model)
    if cfg is None:
        raise ModelNotFound(f"model {req.model!r} is not served here", param="model")
    if req.response_format is not None and req.response_format.type != "text":
        raise InvalidRequest("response_format json_object/json_schema is not supported yet",
                             param="response_format")
    params = resolve_params(req, cfg, s.max_tokens_limit, s.max_stop_sequences)
    backend = select_backend(cfg)
    context = cfg.context_length(backend)
    if params.max_tokens >= context:
        raise ContextLengthExceeded(
            f"max_tokens={params.max_tokens} does not fit this model's context of {context}",
            param="max_tokens")
    messages = [m.model_dump() for m in req.messages] if req.messages is not None else None
    try:
        n_prompt = await state.counter.count(req.model, cfg, req.prompt, messages)
    except Exception as exc:
        raise InvalidRequest(f"could not apply the chat template: {exc}",
                             param="messages") from exc
    if n_prompt + params.max_tokens > context:
        raise ContextLengthExceeded(
            f"this model's context is {context} tokens; the prompt has {n_prompt} and "
            f"max_tokens is {params.max_tokens}; shorten the prompt or lower max_tokens",
            param="messages" if messages is not None else "prompt")

    job_id = new_job_id()
    now = time.time()
    spec = {"prompt": req.prompt, "messages": messages, "params": params.model_dump()}
    fields = {
        "id": job_id, "owner": tenant, "model": req.model, "backend": backend,
        "priority": req.priority, "state": "queued", "attempts": "0", "created_at": repr(now),
        "request": req.model_dump_json(exclude_none=True), "spec": dumps(spec),
        "prompt_tokens": str(n_prompt),
    }
    if req.metadata:
        fields["metadata"] = dumps(req.metadata)
    deadline = deadline if deadline is not None else req.deadline
    if deadline is not None:
        fields["deadline"] = repr(deadline)
    queue = keys.queue(req.model, req.priority)
    ok, depth = await state.scripts["create"](
        keys=[keys.job(job_id), keys.job_events(job_id), queue, keys.tenant_jobs(tenant),
              keys.tenant_queued(tenant), keys.QUEUED],
        args=[dumps(fields), task_message(state.celery, job_id, queue), s.queue_limit,
              s.stream_maxlen, repr(now), s.tenant_max_queued])
    if ok == -2:
        raise QueueFull(f"you have {depth} jobs queued (the limit per tenant); retry later",
                        retry_after=5, code="tenant_queue_full")
    if ok != 1:
        raise QueueFull(f"the queue for {req.model!r} is full ({depth} jobs); retry later",
                        retry_after=max(1, min(60, int(depth) // 100)))
    return JobAccepted(id=job_id, model=req.model, created_at=now,
                       stream_url=f"/v1/jobs/{job_id}/events")


async def get(state: AppState, tenant: str, job_id: str) -> JobRecord:
    h: dict[str, str] = await state.redis.hgetall(keys.job(job_id))  # type: ignore[assignment]
    # Another tenant's job is indistinguishable from a missing one.
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no job {job_id!r}", param="job_id")
    return JobRecord.from_hash(h)


async def cancel(state: AppState, tenant: str, job_id: str, wait_s: float = 2.0) -> JobRecord:
    """Cancel; idempotent. Waits briefly for a running job's engine to let go."""
    await get(state, tenant, job_id)
    s = state.settings
    result = await state.scripts["cancel"](
        keys=[keys.job(job_id), keys.job_events(job_id)],
        args=[repr(time.time()), s.stream_maxlen, s.result_ttl_s])
    if result == "running":
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if await state.redis.hget(keys.job(job_id), "state") != "running":
                break
            await asyncio.sleep(0.05)
    return await get(state, tenant, job_id)


async def events(state: AppState, job_id: str,
                 after: str | None) -> AsyncIterator[tuple[str, str, str]]:
    """(id, event, data JSON) for each stream entry after `after`, to the terminal event.
    The data is relayed as the worker wrote it: no parse and re-encode per token."""
    async for entry_id, fields in state.hub.subscribe(keys.job_events(job_id), after):
        yield entry_id, fields["e"], fields["d"]
