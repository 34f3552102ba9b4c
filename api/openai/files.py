"""OpenAI Files: uploads stored in Redis (or a shared directory), read back in chunks.

An upload is copied in 1 MiB pieces (APPEND to a Redis string, or a file under
`files_dir`), so neither the upload nor a 10,000-line batch file is ever held
whole in the API's memory; readers take it back the same way (GETRANGE).
A batch's output and error files are not stored at all: their lines are
rendered on read from the batch's result lists (api/openai/batches.py).
Quotas, an upload's lease and its expiry (on disk too) are api/openai/file_store.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import UploadFile

from tokenq.api import durable
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RequestTimeout,
)
from tokenq.api.openai.file_store import Refused
from tokenq.shared import keys

log = logging.getLogger(__name__)

PIECE = 1 << 20
Purpose = Literal["batch", "batch_output", "user_data", "fine-tune", "assistants", "vision",
                  "evals"]
UPLOAD_PURPOSES = ("batch", "user_data", "fine-tune", "assistants", "vision", "evals")


def file_object(h: dict[str, str]) -> dict[str, Any]:
    return {"id": h["id"], "object": "file", "bytes": int(h.get("bytes", 0)),
            "created_at": int(float(h["created_at"])), "filename": h.get("filename", ""),
            "purpose": h["purpose"], "status": "processed", "status_details": None,
            "expires_at": int(float(h["expires_at"])) if h.get("expires_at") else None}


def tenant_quota(on_disk: int, in_memory: int, in_redis: bool) -> int:
    """A tenant's byte quota for uploads (0: none): while files live in Redis, the lower
    non-zero one of the two settings."""
    if not in_redis:
        return on_disk
    return min((q for q in (on_disk, in_memory) if q), default=0)


def _path(state: AppState, file_id: str) -> Path | None:
    d = state.settings.api.files_dir
    return None if d is None else Path(d) / file_id


async def create(state: AppState, tenant: str, upload: UploadFile, purpose: str) -> dict[str, Any]:
    """Copy an upload a piece at a time. Its bytes are reserved against the tenant's quota
    before they are written (all at once when the body's size is known, as it is once
    parsed), its lease is pushed on at each piece, and its expiry counts from its first
    byte (api/openai/file_store.py). Whatever stops it midway drops what it wrote."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}",
                             param="purpose")
    s, store = state.settings, state.files
    limit = s.api.max_file_bytes
    if upload.size is not None and upload.size > limit:
        raise PayloadTooLarge(f"file is larger than {limit} bytes", param="file")
    file_id = "file-" + uuid.uuid4().hex
    path = store.path(file_id)
    quota = tenant_quota(s.api.tenant_max_file_bytes, s.api.tenant_max_redis_file_bytes,
                         in_redis=path is None)
    first = time.time()
    held = upload.size or 0
    _check(await store.reserve(tenant, file_id, held, quota=quota,
                               max_files=s.api.tenant_max_files, first=True), quota)
    size = 0
    try:
        while piece := await upload.read(PIECE):
            size += len(piece)
            if size > limit:
                raise PayloadTooLarge(f"file is larger than {limit} bytes", param="file")
            _check(await store.reserve(tenant, file_id, max(0, size - held), quota=quota,
                                       max_files=0, first=False), quota)
            held = max(held, size)
            if path is None:
                await store.append(file_id, piece)
            else:
                await asyncio.to_thread(_append, path, piece)
        now = time.time()
        h = {"id": file_id, "owner": tenant, "purpose": purpose, "bytes": str(size),
             "filename": upload.filename or "upload.jsonl", "created_at": repr(now),
             "kind": "upload", "expires_at": str(int(first + s.api.file_ttl_s))}
        if not await store.commit(tenant, file_id, h, size, int(h["expires_at"])):
            _check(Refused("gone", 0), quota)
    except BaseException:
        await _abandon(state, tenant, file_id)
        raise
    await durable.confirm(state, f"file {file_id}", lambda: delete(state, tenant, file_id))
    return file_object(h)


def _check(got: int | Refused, quota: int) -> None:
    if not isinstance(got, Refused):
        return
    if got.reason == "files":
        raise QuotaExceeded(f"you have {got.held} files, the limit per tenant; delete some "
                            "first", param="file")
    if got.reason == "bytes":
        raise QuotaExceeded(f"your files would exceed {quota} bytes, the limit per tenant "
                            f"({got.held} stored or being uploaded); delete some first",
                            param="file")
    raise RequestTimeout("the upload stalled past its lease and was dropped; send it again",
                         param="file")


async def _abandon(state: AppState, tenant: str, file_id: str) -> None:
    """Drop what a failed upload wrote; if that fails too, the sweeper does once its lease
    ends."""
    try:
        await state.files.drop(tenant, file_id)
    except Exception as exc:
        log.warning("upload %s: cleanup failed (%s); the sweeper will drop it", file_id, exc)


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(data)


async def meta(state: AppState, tenant: str, file_id: str) -> dict[str, str]:
    h: dict[str, str] = await state.redis.hgetall(keys.file(file_id))  # type: ignore[assignment]
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no file {file_id!r}", param="file_id")
    return h


async def listing(state: AppState, tenant: str, purpose: str | None, limit: int,
                  after: str | None) -> dict[str, Any]:
    ids: list[str] = await state.redis.zrevrange(  # type: ignore[assignment]
        keys.tenant_files(tenant), 0, -1)
    if after in ids:
        ids = ids[ids.index(after) + 1:]
    out: list[dict[str, Any]] = []
    for file_id in ids:
        h: dict[str, str] = await state.redis.hgetall(keys.file(file_id))  # type: ignore[assignment]
        if not h:
            await state.redis.zrem(keys.tenant_files(tenant), file_id)
        elif purpose is None or h["purpose"] == purpose:
            out.append(file_object(h))
            if len(out) > limit:
                break
    return {"object": "list", "data": out[:limit], "has_more": len(out) > limit,
            "first_id": out[0]["id"] if out else None,
            "last_id": out[min(limit, len(out)) - 1]["id"] if out else None}


async def delete(state: AppState, tenant: str, file_id: str) -> dict[str, Any]:
    await meta(state, tenant, file_id)
    await state.files.drop(tenant, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


async def iter_bytes(state: AppState, file_id: str) -> AsyncIterator[bytes]:
    """An uploaded file's content, one piece at a time."""
    path = _path(state, file_id)
    offset = 0
    while True:
        if path is None:
            piece: bytes = await state.raw.getrange(  # type: ignore[assignment]
                keys.file_data(file_id), offset,
                                                    offset + PIECE - 1)
        else:
            piece = await asyncio.to_thread(_read, path, offset)
        if not piece:
            return
        offset += len(piece)
        yield piece


def _read(path: Path, offset: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(PIECE)

