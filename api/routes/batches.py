"""OpenAI Batches routes (thin; logic in api/openai/batches.py, work in batch_driver.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from pydantic import BaseModel, ConfigDict

from tokenq.api import durable, idempotency
from tokenq.api.deps import StateDep, TenantDep
from tokenq.api.openai import batches
from tokenq.shared.schemas import Metadata

router = APIRouter(prefix="/v1/batches", tags=["batches"])


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: Metadata | None = None


@router.post("")
async def create_batch(body: BatchCreate, state: StateDep, tenant: TenantDep, response: Response,
                       idempotency_key: Annotated[str | None, Header()] = None
                       ) -> dict[str, Any]:
    idem = idempotency.of(tenant, "batch", idempotency_key, body.model_dump(exclude_none=True))
    batch, replayed = await batches.create(state, tenant, body.input_file_id, body.endpoint,
                                           body.completion_window, body.metadata, idem)
    # Without a key a batch that did not reach the replicas is cancelled (a retry makes a
    # new one); with a key it is kept, and a retry with the key answers it once replicated.
    undo = None if idem is not None else (lambda: batches.cancel(state, tenant, batch["id"]))
    await durable.confirm(state, f"batch {batch['id']}", undo)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return batch


@router.get("")
async def list_batches(state: StateDep, tenant: TenantDep,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20,
                       after: str | None = None) -> dict[str, Any]:
    return await batches.listing(state, tenant, limit, after)


@router.get("/{batch_id}")
async def get_batch(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await batches.get(state, tenant, batch_id)


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await batches.cancel(state, tenant, batch_id)
