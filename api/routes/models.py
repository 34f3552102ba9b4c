"""The model catalogue's admin routes (admin key; logic: api/models_admin.py):
POST /v1/models deploys, PATCH /v1/models/{name} makes a new version, DELETE retires.
GET /v1/models and GET /v1/models/{name} are the OpenAI routes (api/routes/openai.py);
for an admin key the latter adds the entry's state, version, workers and spec."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query
from fastapi.responses import JSONResponse

from tokenq.api import models_admin
from tokenq.api.deps import AdminDep, StateDep

router = APIRouter(prefix="/v1/models", tags=["models"])

JsonBody = Annotated[dict[str, Any], Body()]


@router.post("", status_code=201)
async def deploy_model(body: JsonBody, state: StateDep, _admin: AdminDep) -> JSONResponse:
    """A load request: {name, model_path, server_type, backend, engine knobs, generation
    defaults, keep_alive_s}. 201 with the model object; it loads when a job comes."""
    return JSONResponse(await models_admin.deploy(state, body), status_code=201)


@router.patch("/{name}")
async def patch_model(name: str, body: JsonBody, state: StateDep,
                      _admin: AdminDep) -> dict[str, Any]:
    """Fields of the load request to change: a new version (workers on the old one are
    drained by the autoscaler and the next job loads the new one)."""
    return await models_admin.patch(state, name, body)


@router.delete("/{name}")
async def retire_model(name: str, state: StateDep, _admin: AdminDep,
                       queued: Literal["finish", "fail"] = Query("finish")
                       ) -> dict[str, Any]:
    """New jobs are refused at once; `queued=finish` (default) lets the queued jobs run
    first, `queued=fail` ends them `failed` with model_retired."""
    return await models_admin.retire(state, name, queued)
