"""OpenAI-compatible routes: models, chat/completions, completions (thin; logic in api/openai)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from tokenq.api import lora_admin, models_admin
from tokenq.api.body import parsed
from tokenq.api.deps import PrincipalDep, StateDep, TenantDep
from tokenq.api.errors import ModelNotFound
from tokenq.api.openai import embeddings as embeddings_logic
from tokenq.api.openai import serving
from tokenq.api.openai.embeddings import EmbeddingRequest
from tokenq.api.openai.protocol import (
    ChatCompletionRequest,
    ChatEndpoint,
    CompletionEndpoint,
    CompletionRequest,
)
from tokenq.api.openai.tokenize import context_length

router = APIRouter(prefix="/v1", tags=["openai"])


@router.get("/models")
async def list_models(state: StateDep, who: PrincipalDep) -> dict[str, Any]:
    """Base models, then the loaded LoRA adapters this tenant may use, with their base as
    `parent` (as vLLM lists them): a client selects an adapter by passing its name as
    `model`. An adapter's `root` (its path on the workers) is shown to admin keys only."""
    lens = {name: await context_length(state, name, cfg) for name, cfg in state.models.items()}
    data = [_model(name, None, n) for name, n in lens.items()]
    for rec in await lora_admin.list_records(state.redis):
        ref = rec.ref()
        if ref is not None and rec.base in lens and rec.usable_by(who.tenant):
            data.append(_model(rec.name, rec.base, lens[rec.base],
                               ref.path if who.admin else None))
    return {"object": "list", "data": data}


@router.get("/models/{model_id}")
async def get_model(model_id: str, state: StateDep, who: PrincipalDep) -> dict[str, Any]:
    """For an admin key, a catalogue model (api/models_admin.py) also shows its state,
    version, workers and spec, failed or retired ones included."""
    cfg = state.models.get(model_id)
    entry = await models_admin.get_entry(state.redis, model_id) if who.admin else None
    if entry is not None:
        out = _model(model_id, None, await context_length(state, model_id, cfg)) \
            if cfg is not None else {}
        return {**out, **await models_admin.show(state, entry, admin=True)}
    if cfg is not None:
        return _model(model_id, None, await context_length(state, model_id, cfg))
    found = await lora_admin.resolve(state, model_id, who.tenant)
    if found is None:
        raise ModelNotFound(f"model {model_id!r} is not served here", param="model")
    base, ref = found
    n = await context_length(state, base, state.models[base])
    return _model(model_id, base, n, ref.path if who.admin else None)


def _model(name: str, parent: str | None, max_model_len: int, root: str | None = None
           ) -> dict[str, Any]:
    """max_model_len: what one request may use (prompt + output), as vLLM reports it."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "tokenq",
            "root": root or name, "parent": parent, "max_model_len": max_model_len}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: Annotated[ChatCompletionRequest, Depends(parsed(
        ChatCompletionRequest))], request: Request, state: StateDep,
                           tenant: TenantDep) -> Response:
    return await serving.create(state, tenant, ChatEndpoint, body, request)


@router.post("/embeddings", response_model=None)
async def embeddings(body: Annotated[EmbeddingRequest, Depends(parsed(EmbeddingRequest))],
                     request: Request, state: StateDep, tenant: TenantDep) -> Response:
    return await embeddings_logic.create(state, tenant, body, request)


@router.post("/completions", response_model=None)
async def completions(body: Annotated[CompletionRequest, Depends(parsed(CompletionRequest))],
                      request: Request, state: StateDep, tenant: TenantDep) -> Response:
    return await serving.create(state, tenant, CompletionEndpoint, body, request)
