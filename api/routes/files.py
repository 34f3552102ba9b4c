"""OpenAI Files routes (thin; logic in api/openai/files.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import StreamingResponse

from tokenq.api.deps import StateDep, TenantDep
from tokenq.api.errors import InvalidRequest
from tokenq.api.openai import batch_files, files

router = APIRouter(prefix="/v1/files", tags=["files"])


@router.post("")
async def create_file(request: Request, state: StateDep, tenant: TenantDep,
                      file: Annotated[UploadFile, File()],
                      purpose: Annotated[str, Form()]) -> dict[str, Any]:
    form = await request.form()  # parsed already, for the parameters: read, not parsed again
    for name in ("file", "purpose"):
        if (n := len(form.getlist(name))) > 1:  # which one is meant? not the last, silently
            raise InvalidRequest(f"send one {name!r} part, not {n}", param=name)
    return await files.create(state, tenant, file, purpose)


@router.get("")
async def list_files(state: StateDep, tenant: TenantDep, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
                     after: str | None = None, order: str = "desc") -> dict[str, Any]:
    return await files.listing(state, tenant, purpose, limit, after, order)


@router.get("/{file_id}")
async def get_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    h = await files.meta(state, tenant, file_id)
    return files.file_object(await batch_files.with_size(state, h))


@router.get("/{file_id}/content")
async def file_content(file_id: str, state: StateDep, tenant: TenantDep) -> StreamingResponse:
    h = await files.meta(state, tenant, file_id)
    body = (files.iter_bytes(state, file_id) if h.get("kind", "upload") == "upload"
            else batch_files.render(state, h))
    return StreamingResponse(body, media_type="application/octet-stream", headers={
        "Content-Disposition": f'attachment; filename="{h.get("filename", file_id)}"'})


@router.delete("/{file_id}")
async def delete_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return await files.delete(state, tenant, file_id)
