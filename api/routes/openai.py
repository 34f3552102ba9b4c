"""OpenAI-compatible routes (models now; chat/completions/files/batches build on the queue)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import StateDep, TenantDep

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "tokenq",
         "root": name, "parent": None, "max_model_len": cfg.n_ctx}
        for name, cfg in state.models.items()]}
