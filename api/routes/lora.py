"""LoRA adapter admin routes (admin key): load, unload, list, rollback (logic: api/lora_admin)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from tokenq.api import lora_admin
from tokenq.api.deps import AdminDep, StateDep
from tokenq.api.errors import NotFound
from tokenq.shared.lora_registry import NAME_PATTERN

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])

# How long a route waits for the base model's workers to confirm (they poll every ~0.25 s).
WAIT_S = 30.0


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    model: str = Field(min_length=1)  # the base model
    # On the workers' filesystem: a GGUF LoRA file (llama.cpp) or a PEFT folder (vLLM).
    path: str = Field(min_length=1, max_length=4096)
    wait_s: float = Field(default=WAIT_S, ge=0, le=120)
    # Who may run jobs on it: this tenant (default: the admin key's own), or every tenant
    # with `shared: true`. Other tenants get 404, as for a missing model.
    owner: str | None = Field(default=None, min_length=1, max_length=256)
    shared: bool = False


@router.post("")
async def load_adapter(body: LoadAdapter, state: StateDep, admin: AdminDep) -> dict[str, Any]:
    """Load `path` as the new current version of `name` (a new name or a new version)."""
    return await lora_admin.load(state, body.name, body.model, body.path, body.wait_s,
                               body.owner or admin.tenant, body.shared)


@router.get("")
async def list_adapters(state: StateDep, _admin: AdminDep) -> dict[str, Any]:
    return {"object": "list",
            "data": [rec.public() for rec in await lora_admin.list_records(state.redis)]}


@router.get("/{name}")
async def get_adapter(name: str, state: StateDep, _admin: AdminDep) -> dict[str, Any]:
    rec = await lora_admin.get_record(state.redis, name)
    if rec is None:
        raise NotFound(f"no adapter {name!r}", param="name")
    return rec.public()


@router.delete("/{name}")
async def unload_adapter(name: str, state: StateDep, _admin: AdminDep,
                         wait_s: float = Query(WAIT_S, ge=0, le=120)) -> dict[str, Any]:
    """New jobs can no longer name it; jobs in flight finish on it, then workers free it."""
    return await lora_admin.unload(state, name, wait_s)


@router.post("/{name}/rollback")
async def rollback_adapter(name: str, state: StateDep, _admin: AdminDep,
                           wait_s: float = Query(WAIT_S, ge=0, le=120)) -> dict[str, Any]:
    """Undo the last load or unload of `name` (back to the previous version)."""
    return await lora_admin.rollback(state, name, wait_s)
