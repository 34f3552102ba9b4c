"""chat/completions on the queue: submit a job, then relay or await its event stream.

A streaming request relays the job's Redis Stream as OpenAI chunks (one per
token event) ending with `data: [DONE]`; a non-streaming one waits for the
terminal event and answers from the job record. Either way, a client that goes
away cancels its job when `cancel_on_disconnect` is on (interactive traffic:
a slot generating for nobody is wasted), so the engine frees the slot.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from api import service
from api.deps import AppState
from api.errors import Conflict, InvalidRequest, JobExpired, JobFailed
from api.openai.protocol import (
    ChatCompletionRequest,
    ChatEndpoint,
    CompletionRequest,
    chunk,
    final_response,
    now,
)
from shared.jobs import dumps
from shared.schemas import JobRecord

log = logging.getLogger(__name__)
_background: set[asyncio.Task[Any]] = set()  # cancels scheduled from closing streams
CLIENT_ERROR_CODES = frozenset({"context_length_exceeded", "bad_request", "invalid_request"})


async def create(state: AppState, tenant: str, endpoint: str,
                 body: ChatCompletionRequest | CompletionRequest, request: Request) -> Response:
    accepted = await service.submit(state, tenant, body.to_job(), extra={"endpoint": endpoint})
    headers = {"X-Tokenq-Job-Id": accepted.id}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        s = state.settings
        return EventSourceResponse(
            _chunks(state, tenant, endpoint, accepted.id, body.model, include_usage),
            ping=s.sse_ping_s, send_timeout=s.sse_send_timeout_s, headers=headers)
    rec = await _await_end(state, tenant, accepted.id, request)
    return JSONResponse(final_response(endpoint, raise_for_state(rec)), headers=headers)


def raise_for_state(rec: JobRecord) -> JobRecord:
    """A terminal record that is not `succeeded` becomes the matching OpenAI error."""
    if rec.state == "succeeded":
        return rec
    if rec.state == "cancelled":
        raise Conflict(f"job {rec.id} was cancelled", code="cancelled")
    if rec.state == "expired":
        raise JobExpired(f"job {rec.id} passed its deadline before it could run")
    err = rec.error
    if err is not None and err.code in CLIENT_ERROR_CODES:
        raise InvalidRequest(err.message, code=err.code)
    raise JobFailed(err.message if err else f"job {rec.id} failed",
                    code=err.code if err else None)


def _cancel_later(state: AppState, tenant: str, job_id: str) -> None:
    if not state.settings.cancel_on_disconnect:
        return
    log.info("job %s: client went away; cancelling", job_id)
    task = asyncio.get_running_loop().create_task(service.cancel(state, tenant, job_id, 0))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _await_end(state: AppState, tenant: str, job_id: str, request: Request) -> JobRecord:
    async def terminal() -> None:
        async for _ in service.events(state, job_id, None):
            pass  # the iterator ends after the terminal event

    waiter = asyncio.create_task(terminal())
    try:
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=0.5)
            if not waiter.done() and await request.is_disconnected():
                _cancel_later(state, tenant, job_id)
                break
        else:
            waiter.result()
    finally:
        waiter.cancel()
    return await service.get(state, tenant, job_id)


async def _chunks(state: AppState, tenant: str, endpoint: str, job_id: str, model: str,
                  include_usage: bool) -> AsyncIterator[ServerSentEvent]:
    created, ended = now(), False

    def sse(obj: dict[str, Any]) -> ServerSentEvent:
        return ServerSentEvent(data=dumps(obj))

    try:
        if endpoint == ChatEndpoint:
            yield sse(chunk(endpoint, job_id, model, created, role=True, text=""))
        async for _, event, raw in service.events(state, job_id, None):
            data = json.loads(raw)
            if event == "token":
                yield sse(chunk(endpoint, job_id, model, created, text=data["text"]))
            elif event == "done":
                ended = True
                yield sse(chunk(endpoint, job_id, model, created,
                                finish_reason=data["finish_reason"]))
                if include_usage:
                    u = data.get("usage") or {}
                    p, c = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
                    yield sse(chunk(endpoint, job_id, model, created,
                                    usage_={"prompt_tokens": p, "completion_tokens": c,
                                            "total_tokens": p + c}))
            elif event in ("error", "cancelled"):
                # An error after the stream started goes out as a stream event (vLLM's way).
                ended = True
                code = data.get("code", "cancelled")
                msg = data.get("message", f"job {job_id} was cancelled")
                yield sse({"error": {"message": msg, "type": "server_error", "code": code,
                                     "param": None}})
        yield ServerSentEvent(data="[DONE]")
    finally:
        if not ended:
            _cancel_later(state, tenant, job_id)
