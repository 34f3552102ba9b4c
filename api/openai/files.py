"""OpenAI Files: uploads stored in Redis (or a shared directory), read back in chunks.

An upload is copied in 1 MiB pieces (APPEND to a Redis string, or a file under
`files_dir`), so neither the upload nor a 10,000-line batch file is ever held
whole in the API's memory; readers take it back the same way (GETRANGE).
A batch's output and error files are not stored at all: their lines are
rendered on read from the batch's result lists (api/openai/batch_files.py).
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

from tokenq.api import durable, ids
from tokenq.api.deps import AppState
from tokenq.api.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RequestTimeout,
)
from tokenq.api.openai import batch_files
from tokenq.api.openai.file_store import Refused
from tokenq.shared import keys

log = logging.getLogger(__name__)

PIECE = 1 << 20
LIST_CHUNK = 100  # file ids read per round trip while listing
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
    if upload.size == 0:
        raise _empty()
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
        if size == 0:
            raise _empty()
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


def _empty() -> InvalidRequest:
    # OpenAI's answer; before, an empty upload was stored and its batch failed `empty_file`
    return InvalidRequest("File is empty.", param="file")


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
    ids.check("file", file_id, "file_id")
    h: dict[str, str] = await state.redis.hgetall(keys.file(file_id))  # type: ignore[assignment]
    if not h or h.get("owner") != tenant:
        raise NotFound(f"no file {file_id!r}", param="file_id")
    return h


async def listing(state: AppState, tenant: str, purpose: str | None, limit: int,
                  after: str | None, order: str = "desc") -> dict[str, Any]:
    """By creation time, newest first (`order=asc`: oldest first); `after` must be a file of
    this list (400 otherwise, as jobs and batches)."""
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    index = keys.tenant_files(tenant)
    page = state.redis.zrange if order == "asc" else state.redis.zrevrange
    start = 0
    if after is not None:
        rank: int | None = await (state.redis.zrank if order == "asc"  # type: ignore[assignment]
                                  else state.redis.zrevrank)(index, after)
        if rank is None:
            raise InvalidRequest(f"after: no file {after!r} in this list", param="after")
        start = rank + 1
    out: list[dict[str, Any]] = []
    seen: set[str] = set()  # the index may move under the pages (uploads, deletes)
    while len(out) <= limit:
        ids: list[str] = await page(index, start, start + LIST_CHUNK - 1)  # type: ignore[assignment]
        if not ids:
            break
        start += len(ids)
        for file_id in ids:
            if file_id in seen:
                continue
            seen.add(file_id)
            h: dict[str, str] = await state.redis.hgetall(keys.file(file_id))  # type: ignore[assignment]
            if not h:
                if await state.redis.zrem(index, file_id):
                    start -= 1  # the entries after it moved up by one
            elif purpose is None or h["purpose"] == purpose:
                out.append(file_object(await batch_files.with_size(state, h)))
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


class FileGone(Exception):
    """The file was deleted (or expired) before, or while, it was read."""


async def iter_whole(state: AppState, file_id: str) -> AsyncIterator[bytes]:
    """`iter_bytes`, raising FileGone at its end unless the whole file was read: a deleted
    file reads as empty or cut short (its content goes with its record), never as itself."""
    size = 0
    try:
        async for piece in iter_bytes(state, file_id):
            size += len(piece)
            yield piece
    except FileNotFoundError as exc:  # on disk (files_dir): unlinked
        raise FileGone(file_id) from exc
    stored = await state.redis.hget(keys.file(file_id), "bytes")
    if stored is None or int(stored) != size:
        raise FileGone(file_id)


def _read(path: Path, offset: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(PIECE)

