"""OpenAI Files: uploads stored in Redis (or a shared directory), read back in chunks.

An upload is copied in 1 MiB pieces (APPEND to a Redis string, or a file under
`files_dir`), so neither the upload nor a 10,000-line batch file is ever held
whole in the API's memory; readers take it back the same way (GETRANGE).
A batch's output and error files are not stored at all: their lines are
rendered on read from the batch's result lists (api/openai/batches.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from fastapi import UploadFile

from tokenq.api import durable
from tokenq.api.deps import AppState
from tokenq.api.errors import InvalidRequest, NotFound, PayloadTooLarge, QuotaExceeded
from tokenq.shared import keys

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
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}",
                             param="purpose")
    s, r = state.settings, state.redis
    count, used = await usage(state, tenant)
    if s.api.tenant_max_files and count >= s.api.tenant_max_files:
        raise QuotaExceeded(f"you have {count} files, the limit per tenant; delete some "
                            "first", param="file")
    file_id = "file-" + uuid.uuid4().hex
    path = _path(state, file_id)
    quota = tenant_quota(s.api.tenant_max_file_bytes, s.api.tenant_max_redis_file_bytes,
                         in_redis=path is None)
    size = 0
    try:
        while piece := await upload.read(PIECE):
            size += len(piece)
            if size > s.api.max_file_bytes:
                raise PayloadTooLarge(f"file is larger than {s.api.max_file_bytes} bytes",
                                      param="file")
            if quota and used + size > quota:
                raise QuotaExceeded(f"your files would exceed {quota} "
                                    f"bytes, the limit per tenant ({used} stored); delete "
                                    "some first", param="file")
            if path is None:
                await state.raw.append(keys.file_data(file_id), piece)
            else:
                await asyncio.to_thread(_append, path, piece)
    except BaseException:
        await _drop_data(state, file_id)
        raise
    now = time.time()
    h = {"id": file_id, "owner": tenant, "purpose": purpose, "bytes": str(size),
         "filename": upload.filename or "upload.jsonl", "created_at": repr(now), "kind": "upload"}
    pipe = r.pipeline(transaction=True)
    pipe.hset(keys.file(file_id), mapping=h)  # type: ignore[arg-type]
    pipe.expire(keys.file(file_id), s.api.file_ttl_s)
    if path is None:
        pipe.expire(keys.file_data(file_id), s.api.file_ttl_s)
    pipe.zadd(keys.tenant_files(tenant), {file_id: now})
    pipe.zadd(keys.tenant_upload_bytes(tenant), {file_id: size})
    await pipe.execute()
    await durable.confirm(state, f"file {file_id}", lambda: delete(state, tenant, file_id))
    return file_object(h)


async def usage(state: AppState, tenant: str) -> tuple[int, int]:
    """(uploads, their bytes) the tenant holds now; expired uploads are dropped first."""
    r = state.redis
    held: list[tuple[str, float]] = await r.zrange(  # type: ignore[assignment]
        keys.tenant_upload_bytes(tenant), 0, -1, withscores=True)
    if not held:
        return 0, 0
    pipe = r.pipeline(transaction=False)
    for file_id, _ in held:
        pipe.exists(keys.file(file_id))
    alive = await pipe.execute()
    gone = [f for (f, _), ok in zip(held, alive, strict=True) if not ok]
    if gone:
        await r.zrem(keys.tenant_upload_bytes(tenant), *gone)
    kept = [int(n) for (_, n), ok in zip(held, alive, strict=True) if ok]
    return len(kept), sum(kept)


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as f:
        f.write(data)


async def _drop_data(state: AppState, file_id: str) -> None:
    path = _path(state, file_id)
    if path is None:
        await state.redis.delete(keys.file_data(file_id))
    else:
        await asyncio.to_thread(path.unlink, True)


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
    await _drop_data(state, file_id)
    await state.redis.delete(keys.file(file_id))
    await state.redis.zrem(keys.tenant_files(tenant), file_id)
    await state.redis.zrem(keys.tenant_upload_bytes(tenant), file_id)
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

