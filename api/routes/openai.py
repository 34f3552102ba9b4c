"""OpenAI-compatible routes: models, chat/completions, completions (thin; logic in api/openai)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.deps import StateDep, TenantDep
from api.openai import serving
from api.openai.protocol import (
    ChatCompletionRequest,
    ChatEndpoint,
    CompletionEndpoint,
    CompletionRequest,
)
from shared.errors import ModelNotFound

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "tokenq",
         "root": name, "parent": None, "max_model_len": cfg.n_ctx}
        for name, cfg in state.models.items()]}


@router.get("/models/{model_id}")
async def get_model(model_id: str, state: StateDep, _tenant: TenantDep) -> dict[str, Any]:
    cfg = state.models.get(model_id)
    if cfg is None:
        raise ModelNotFound(f"model {model_id!r} is not served here", param="model")
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "tokenq",
            "root": model_id, "parent": None, "max_model_len": cfg.n_ctx}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep,
                           tenant: TenantDep) -> Response:
    return await serving.create(state, tenant, ChatEndpoint, body, request)


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request, state: StateDep,
                      tenant: TenantDep) -> Response:
    return await serving.create(state, tenant, CompletionEndpoint, body, request)
