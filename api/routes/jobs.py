"""Native jobs API: POST/GET/DELETE /v1/jobs, GET /v1/jobs/{id}/events (SSE)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Query, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from api import service
from api.deps import StateDep, TenantDep
from api.streams import is_valid_id
from shared.errors import InvalidRequest
from shared.schemas import JobAccepted, JobRecord, JobRequest

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=202, response_model=JobAccepted)
async def create_job(body: JobRequest, state: StateDep, tenant: TenantDep,
                     response: Response) -> JobAccepted:
    accepted = await service.submit(state, tenant, body)
    response.headers["Location"] = f"/v1/jobs/{accepted.id}"
    return accepted


@router.get("/{job_id}", response_model=JobRecord)
async def get_job(job_id: str, state: StateDep, tenant: TenantDep) -> JobRecord:
    return await service.get(state, tenant, job_id)


@router.delete("/{job_id}", response_model=JobRecord)
async def cancel_job(job_id: str, state: StateDep, tenant: TenantDep) -> JobRecord:
    return await service.cancel(state, tenant, job_id)


@router.get("/{job_id}/events", response_class=EventSourceResponse)
async def job_events(
    job_id: str, state: StateDep, tenant: TenantDep,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
    last_event_id_q: str | None = Query(default=None, alias="last_event_id"),
) -> EventSourceResponse:
    await service.get(state, tenant, job_id)  # 404 before the stream starts
    after = last_event_id or last_event_id_q
    if after is not None and not is_valid_id(after):
        raise InvalidRequest("Last-Event-ID must be a stream id like 1700000000000-0",
                             param="last_event_id")

    async def gen() -> AsyncIterator[ServerSentEvent]:
        async for entry_id, event, data in service.events(state, job_id, after):
            yield ServerSentEvent(id=entry_id, event=event, data=data)

    s = state.settings
    return EventSourceResponse(gen(), ping=s.sse_ping_s, send_timeout=s.sse_send_timeout_s)
