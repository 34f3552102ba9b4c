"""vLLM's /tokenize and /detokenize (thin; logic in api/openai/tokenize.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from tokenq.api.body import parsed
from tokenq.api.deps import StateDep, TenantDep
from tokenq.api.openai import tokenize as logic
from tokenq.api.openai.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["openai"])


# The logic answers JSON bytes, encoded off the event loop (a long prompt's token list).
@router.post("/tokenize", response_class=Response)
async def tokenize(body: Annotated[TokenizeRequest, Depends(parsed(TokenizeRequest))],
                   state: StateDep, tenant: TenantDep) -> Response:
    return Response(await logic.tokenize(state, tenant, body), media_type="application/json")


@router.post("/detokenize", response_class=Response)
async def detokenize(body: Annotated[DetokenizeRequest, Depends(parsed(DetokenizeRequest))],
                     state: StateDep, tenant: TenantDep) -> Response:
    return Response(await logic.detokenize(state, tenant, body),
                    media_type="application/json")
