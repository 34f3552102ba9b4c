"""vLLM's /tokenize and /detokenize (thin; logic in api/openai/tokenize.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from tokenq.api.deps import StateDep, TenantDep
from tokenq.api.openai import tokenize as logic
from tokenq.api.openai.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["openai"])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await logic.tokenize(state, tenant, body)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, state: StateDep,
                     tenant: TenantDep) -> dict[str, Any]:
    return await logic.detokenize(state, tenant, body)
