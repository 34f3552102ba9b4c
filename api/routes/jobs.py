"""Native jobs API: POST/GET/DELETE /v1/jobs, GET /v1/jobs/{id}/events (SSE)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from starlette.background import BackgroundTask

from tokenq.api import idempotency, joblist, queued_updates, service, sse
from tokenq.api.body import parsed
from tokenq.api.deps import AppState, StateDep, TenantDep
from tokenq.api.errors import InvalidRequest, RateLimited
from tokenq.api.stream_ids import is_valid_id
from tokenq.api.streams import BadCursor
from tokenq.shared.jobs import dumps
from tokenq.shared.schemas import TERMINAL_EVENTS, JobAccepted, JobRecord, JobRequest

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, response_model=JobAccepted)
async def create_job(body: Annotated[JobRequest, Depends(parsed(JobRequest))],
                     state: StateDep, tenant: TenantDep, response: Response,
                     idempotency_key: Annotated[str | None, Header()] = None) -> JobAccepted:
    idem = idempotency.of(tenant, "job", idempotency_key, body.model_dump(exclude_none=True))
    accepted, replayed = await service.submit_once(state, tenant, body, idem)
    response.headers["Location"] = f"/v1/jobs/{accepted.id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return accepted


@router.get("")
async def list_jobs(request: Request, state: StateDep, tenant: TenantDep,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20,
                    after: str | None = None, status: str | None = None,
                    old_status: Annotated[str | None, Query(
                        alias="state", include_in_schema=False)] = None,
                    model: str | None = None) -> dict[str, Any]:
    """This API key's jobs, newest first: `status`, `model` and `metadata[key]=value`
    filters (`state=` is the filter's older name); OpenAI's list object (`after=<last_id>`
    for the next page)."""
    return await joblist.listing(
        state, tenant, limit=limit, after=after, state=status or old_status, model=model,
        metadata=joblist.metadata_filter(list(request.query_params.multi_items())))


@router.get("/{job_id}", response_model=JobRecord)
async def get_job(job_id: str, state: StateDep, tenant: TenantDep) -> JobRecord:
    rec = await queued_updates.fill(state, await service.get(state, tenant, job_id))
    if rec.status == "queued" and rec.reason is None:
        # Taken (or cancelled) between the record's read and the estimate's: the record
        # said queued, its lane no longer did. Read it again rather than answer `queued`
        # with neither a position nor a reason.
        rec = await queued_updates.fill(state, await service.get(state, tenant, job_id))
    return rec


@router.delete("/{job_id}", response_model=JobRecord)
async def cancel_job(job_id: str, state: StateDep, tenant: TenantDep) -> JobRecord:
    return await service.cancel(state, tenant, job_id)


@router.get("/{job_id}/events", response_class=sse.EventStream, response_model=None)
async def job_events(
    job_id: str, state: StateDep, tenant: TenantDep,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
    last_event_id_q: str | None = Query(default=None, alias="last_event_id"),
    cancel_on_disconnect: bool = Query(default=False),
) -> Response:
    """The job's events. A native stream survives its client (resume with Last-Event-ID),
    so a disconnect leaves the job running unless the client asked otherwise with
    `?cancel_on_disconnect=true` (interactive use: the engine slot is freed at once)."""
    await service.check_owner(state, tenant, job_id)  # 404 before the stream starts
    after = last_event_id or last_event_id_q
    if after is not None:
        # Strictly the form of our event ids: nothing else may reach the shared XREAD.
        if not is_valid_id(after):
            raise InvalidRequest("Last-Event-ID must be an event id of this stream, like "
                                 "1700000000000-0", param="last_event_id")
        after = await service.resume_point(state, job_id, after)
        if after is None:
            return Response(status_code=204)  # after the terminal event: nothing can follow
    limit = state.settings.api.max_streams_per_tenant
    if limit and state.open_streams.get(tenant, 0) >= limit:
        raise RateLimited(f"{limit} event streams are open for this API key on this replica; "
                          "close one first", retry_after=1, code="too_many_streams")
    # Counted here, on the event loop, so concurrent opens cannot overshoot; released when
    # the generator ends, or at once if the response never starts it.
    state.open_streams[tenant] = state.open_streams.get(tenant, 0) + 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.open_streams[tenant] -= 1

    async def gen() -> AsyncIterator[bytes]:
        ended = False
        try:
            async for entry_id, event, data in queued_updates.with_updates(
                    state, job_id, service.events(state, job_id, after)):
                ended = event in TERMINAL_EVENTS
                yield sse.event(data, event=event, id=entry_id)
        except BadCursor:
            # Redis refused this stream's cursor: this stream ends, no other one does.
            yield sse.event(dumps({
                "code": "invalid_cursor", "message": "the stream cannot be read from this "
                "Last-Event-ID; reconnect without it"}), event="error")
        finally:
            release()
            if cancel_on_disconnect and not ended:
                cancel_soon(state, tenant, job_id)

    s = state.settings
    return sse.EventStream(gen(), ping_s=s.api.sse_ping_s, send_timeout_s=s.api.sse_send_timeout_s,
                           background=BackgroundTask(release))


_background: set[asyncio.Task[object]] = set()


def cancel_soon(state: AppState, tenant: str, job_id: str) -> None:
    """Cancel from a generator's cleanup: a task of its own, which the ending stream's
    cancellation cannot take down with it."""
    task = asyncio.get_running_loop().create_task(service.cancel(state, tenant, job_id, 0))
    _background.add(task)
    task.add_done_callback(_background.discard)
