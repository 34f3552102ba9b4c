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

from tokenq.api import service, sse
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    ClientClosed,
    Conflict,
    InvalidRequest,
    JobExpired,
    JobFailed,
    TokenqError,
)
from tokenq.api.openai.protocol import (
    ChatCompletionRequest,
    ChatEndpoint,
    CompletionRequest,
    chat_logprobs,
    chunk,
    completion_logprobs,
    final_response,
    finish_reason,
    now,
    usage,
)
from tokenq.api.openai.tool_parsers import ToolStream
from tokenq.api.openai.tools import Plan, plan_for
from tokenq.shared.jobs import dumps
from tokenq.shared.schemas import JobRecord

log = logging.getLogger(__name__)
_background: set[asyncio.Task[Any]] = set()  # cancels scheduled from closing streams
CLIENT_ERROR_CODES = frozenset({"context_length_exceeded", "bad_request", "invalid_request"})


async def create(state: AppState, tenant: str, endpoint: str,
                 body: ChatCompletionRequest | CompletionRequest, request: Request) -> Response:
    jobs = await _submit(state, tenant, endpoint, body)
    plan = (await plan_for(state, tenant, body.to_job())
            if isinstance(body, ChatCompletionRequest) else None)
    headers = {"X-Tokenq-Job-Id": jobs[0]}
    if len(jobs) > 1:
        headers["X-Tokenq-Job-Ids"] = ",".join(jobs)
    want_lp = body.log_k() is not None
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        s = state.settings
        return sse.EventStream(
            _chunks(state, tenant, endpoint, jobs, body.model, include_usage, plan),
            ping_s=s.api.sse_ping_s, send_timeout_s=s.api.sse_send_timeout_s, headers=headers)
    ended = await await_all(state, tenant, jobs, request, want_lp)
    try:
        recs = [raise_for_state(rec) for rec, _ in ended]
    except TokenqError as exc:  # the job ran to this end: its id helps to look it up
        exc.headers = headers
        raise
    lps = [lp for _, lp in ended] if want_lp else None
    return JSONResponse(final_response(endpoint, recs, lps, plan), headers=headers)


async def _submit(state: AppState, tenant: str, endpoint: str,
                  body: ChatCompletionRequest | CompletionRequest) -> list[str]:
    """One job per choice (n): each runs, streams and can be taken over like any job. With a
    seed, choice i samples with seed + i, so the choices differ and replay exactly. If a
    later sibling is refused (queue full), the ones already queued are cancelled."""
    jobs: list[str] = []
    try:
        for i in range(body.n or 1):
            job = body.to_job()
            if job.seed is not None and i:
                job.seed += i
            accepted = await service.submit(state, tenant, job, extra={"endpoint": endpoint})
            jobs.append(accepted.id)
    except BaseException:
        for job_id in jobs:
            await service.cancel(state, tenant, job_id, 0)
        raise
    return jobs


def raise_for_state(rec: JobRecord) -> JobRecord:
    """A terminal record that is not `succeeded` becomes the matching OpenAI error, marked
    not to be retried: the job already ran (its worker attempts included) to this end."""
    if rec.status == "succeeded":
        return rec
    exc: TokenqError
    err = rec.error
    if rec.status == "cancelled":
        exc = Conflict(f"job {rec.id} was cancelled", code="cancelled")
    elif rec.status == "expired":
        exc = JobExpired(f"job {rec.id} passed its deadline before it could run")
    elif err is not None and err.code in CLIENT_ERROR_CODES:
        exc = InvalidRequest(err.message, code=err.code)
    else:
        exc = JobFailed(err.message if err else f"job {rec.id} failed",
                        code=err.code if err else None)
    exc.should_retry = False
    raise exc


def _cancel_later(state: AppState, tenant: str, job_id: str) -> None:
    if not state.settings.api.cancel_on_disconnect:
        return
    log.info("job %s: client went away; cancelling", job_id)
    task = asyncio.get_running_loop().create_task(service.cancel(state, tenant, job_id, 0))
    _background.add(task)
    task.add_done_callback(_background.discard)


async def await_all(state: AppState, tenant: str, jobs: list[str], request: Request,
                     want_lp: bool) -> list[tuple[JobRecord, list[dict[str, Any]]]]:
    """Wait for every choice's job to end, keeping each one's logprobs entries when asked.
    A client that goes away cancels them all."""
    lps: list[list[dict[str, Any]]] = [[] for _ in jobs]

    async def terminal(i: int) -> None:
        async for _, event, raw in service.events(state, jobs[i], None):
            if want_lp and event == "token":
                entry = json.loads(raw).get("logprobs")
                if entry is not None:
                    lps[i].append(entry)

    waiters = {asyncio.create_task(terminal(i)) for i in range(len(jobs))}
    try:
        pending = set(waiters)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.5)
            if pending and await request.is_disconnected():
                for job_id in jobs:
                    _cancel_later(state, tenant, job_id)
                raise ClientClosed("the client closed the connection before the reply; "
                                   f"job {jobs[0]} is cancelled")
        for w in waiters:
            if w.done() and not w.cancelled():
                w.result()
    finally:
        for w in waiters:
            w.cancel()
    return [(await service.get(state, tenant, job_id), lps[i]) for i, job_id in enumerate(jobs)]


async def _chunks(state: AppState, tenant: str, endpoint: str, jobs: list[str], model: str,
                  include_usage: bool, plan: Plan | None = None
                  ) -> AsyncIterator[bytes]:
    """The choices' event streams merged into one chunk stream (choice i = jobs[i]). With
    tools, each choice's text goes through a ToolStream: content and tool-call deltas."""
    created, first = now(), jobs[0]
    open_ = set(range(len(jobs)))
    merged: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()

    async def relay(i: int) -> None:
        async for _, event, raw in service.events(state, jobs[i], None):
            await merged.put((i, event, raw))

    def out(obj: dict[str, Any]) -> bytes:
        return sse.event(dumps(obj))

    relays = [asyncio.create_task(relay(i)) for i in range(len(jobs))]
    offsets = [0] * len(jobs)  # completions' text_offset per choice
    tools = ([ToolStream(plan, job_id) for job_id in jobs] if plan is not None and plan.parses
             else None)
    held: list[list[dict[str, Any]]] = [[] for _ in jobs]  # logprobs not sent yet
    prompt_tokens = completion_tokens = 0
    try:
        if endpoint == ChatEndpoint:
            for i in range(len(jobs)):
                yield out(chunk(endpoint, first, model, created, role=True, text="", index=i))
        while open_:
            i, event, raw = await merged.get()
            data = json.loads(raw)
            if event == "token":
                entry = data.get("logprobs")
                lp = None
                if entry is not None:
                    lp = (chat_logprobs([entry]) if endpoint == ChatEndpoint
                          else completion_logprobs([entry], offsets[i]))
                    offsets[i] += len(entry["token"])
                if tools is None:
                    yield out(chunk(endpoint, first, model, created, text=data["text"],
                                    index=i, logprobs=lp))
                    continue
                if entry is not None:  # a token's logprobs ride on the next delta sent
                    held[i].append(entry)
                for d in tools[i].feed(data["text"]):
                    yield out(chunk(endpoint, first, model, created, index=i, delta=d,
                                    logprobs=chat_logprobs(held[i]) if held[i] else None))
                    held[i] = []
            elif event == "done":
                open_.discard(i)
                u = data.get("usage") or {}
                prompt_tokens = int(u.get("prompt_tokens", 0))
                completion_tokens += int(u.get("completion_tokens", 0))
                reason = data["finish_reason"]
                if tools is not None:
                    for d in tools[i].finish():
                        yield out(chunk(endpoint, first, model, created, index=i, delta=d,
                                        logprobs=chat_logprobs(held[i]) if held[i] else None))
                        held[i] = []
                    reason = finish_reason(plan, tools[i].called, reason)
                yield out(chunk(endpoint, first, model, created, index=i,
                                text=None if tools is not None else "",
                                finish_reason=reason))
            elif event in ("error", "cancelled"):
                # An error after the stream started goes out as a stream event (vLLM's way);
                # the other choices stop with it.
                code = data.get("code", "cancelled")
                msg = data.get("message", f"job {jobs[i]} was cancelled")
                yield out({"error": {"message": msg, "type": "server_error", "code": code,
                                     "param": None}})
                break
        if not open_ and include_usage:
            yield out(chunk(endpoint, first, model, created,
                            usage_=usage(prompt_tokens, completion_tokens)))
        yield sse.event("[DONE]")
    finally:
        for task in relays:
            task.cancel()
        for i in open_:
            _cancel_later(state, tenant, jobs[i])
