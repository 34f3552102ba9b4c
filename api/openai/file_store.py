"""Uploads in Redis: quota reservations, an upload's lease, commit, and the expiry sweep.

Every upload has a place in the index `tokenq:uploads` from before its first byte is
written until its last copy is gone, scored by a deadline: while it is copied, a lease
(UPLOAD_LEASE_S, pushed on at every piece); once stored, its expiry (first byte +
file_ttl_s, when its Redis keys expire too); once dropped, 0. So nothing an upload writes
outlives it: an upload whose process died midway is past its lease a minute later, and
its content in Redis has carried that lease as a TTL from its first byte.

Bytes are reserved against the tenant's quota by one script (file_reserve.lua) that sums
what the tenant holds and adds the upload's share only if the total stays within the
quota: parallel uploads cannot both pass a check and then both write.

One API replica at a time sweeps (a lease key like the batch driver's, renewed while it
holds it): whatever is past its deadline loses its Redis side first (file_drop.lua: its
quota is free then), then its copy on disk, then its place in the index. A sweeper that
dies in between leaves the index entry at 0, so the next one finishes the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tokenq.shared import keys
from tokenq.shared.lua_scripts import Scripts

log = logging.getLogger(__name__)

UPLOAD_LEASE_S = 60.0  # an upload's pieces come from the spooled body: seconds apart at most
SWEEP_S = 5.0  # how often the sweeper looks for expired uploads
SWEEPER_LEASE_MS = 30_000
SWEEP_CHUNK = 100


@dataclass(frozen=True)
class Refused:
    """Why a reservation failed: too many files, over the byte quota, or the upload is gone
    (its lease ran out). `held`: the tenant's files (count) or bytes at that moment."""

    reason: Literal["files", "bytes", "gone"]
    held: int


class FileStore:
    def __init__(self, r: aioredis.Redis, files_dir: Path | None):
        self.r = r
        self.files_dir = files_dir
        self.me = uuid.uuid4().hex  # this replica's sweeper lease value
        self._scripts = Scripts(r, ("file_reserve", "file_commit", "file_drop", "renew"))

    def path(self, file_id: str) -> Path | None:
        return None if self.files_dir is None else self.files_dir / file_id

    @staticmethod
    def lease_until(now: float) -> int:
        return math.ceil(now + UPLOAD_LEASE_S)

    async def reserve(self, tenant: str, file_id: str, add: int, *, quota: int,
                      max_files: int, first: bool) -> int | Refused:
        """Hold `add` more bytes for the upload (the first call registers it) and push its
        lease on: the tenant's bytes held now, or why not."""
        now = time.time()
        got = await self._scripts["file_reserve"](
            keys=[keys.tenant_upload_bytes(tenant), keys.UPLOADS],
            args=[file_id, tenant, add, quota, max_files, repr(now), self.lease_until(now),
                  "1" if first else "0"])
        if int(got[0]) == 1:
            return int(got[1])
        reason = got[1].decode() if isinstance(got[1], bytes) else str(got[1])
        assert reason in ("files", "bytes", "gone"), reason
        return Refused(reason, int(got[2]))  # type: ignore[arg-type]

    async def append(self, file_id: str, piece: bytes) -> None:
        """A piece of an upload kept in Redis: its content carries the upload's lease as
        its TTL from the first byte (the commit sets its expiry)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.append(keys.file_data(file_id), piece)
        pipe.expireat(keys.file_data(file_id), self.lease_until(time.time()))
        await pipe.execute()

    async def commit(self, tenant: str, file_id: str, fields: dict[str, str], size: int,
                     expires_at: int) -> bool:
        """The upload becomes a file until `expires_at`; False if its lease ran out."""
        pairs = [x for kv in fields.items() for x in kv]
        return bool(await self._scripts["file_commit"](
            keys=self._file_keys(tenant, file_id),
            args=[keys.upload_member(file_id, tenant), file_id, repr(time.time()), expires_at,
                  size, *pairs]))

    async def drop(self, tenant: str, file_id: str, *, only_expired: bool = False) -> bool:
        """Delete the upload everywhere (Redis, disk, the index); with `only_expired`, only
        if its deadline has passed. False: not due."""
        dropped = await self._scripts["file_drop"](
            keys=self._file_keys(tenant, file_id),
            args=[keys.upload_member(file_id, tenant), file_id, repr(time.time()),
                  "1" if only_expired else "0"])
        if not dropped:
            return False
        path = self.path(file_id)
        if path is not None:
            await asyncio.to_thread(path.unlink, True)
        await self.r.zrem(keys.UPLOADS, keys.upload_member(file_id, tenant))
        return True

    def _file_keys(self, tenant: str, file_id: str) -> list[str]:
        return [keys.UPLOADS, keys.file(file_id), keys.file_data(file_id),
                keys.tenant_files(tenant), keys.tenant_upload_bytes(tenant)]

    async def sweep(self) -> int:
        """Drop every upload past its deadline; how many."""
        swept = 0
        while True:
            due: list[str] = await self.r.zrangebyscore(  # type: ignore[assignment]
                keys.UPLOADS, "-inf", repr(time.time()), start=0, num=SWEEP_CHUNK)
            if not due:
                return swept
            for member in due:
                file_id, tenant = keys.upload_of(member)
                if await self.drop(tenant, file_id, only_expired=True):
                    swept += 1
            if not await self.hold_sweeper():
                return swept  # another replica took over

    async def hold_sweeper(self) -> bool:
        """Keep this replica's sweeper lease, or take it if nobody holds it."""
        if await self._scripts["renew"](keys=[keys.UPLOADS_SWEEPER],
                                        args=[self.me, SWEEPER_LEASE_MS]):
            return True
        return bool(await self.r.set(keys.UPLOADS_SWEEPER, self.me, nx=True,
                                     px=SWEEPER_LEASE_MS))

    async def run(self, stopping: asyncio.Event) -> None:
        """The sweeper loop of one API replica (only the lease holder sweeps)."""
        while not stopping.is_set():
            try:
                if await self.hold_sweeper():
                    n = await self.sweep()
                    if n:
                        log.info("uploads: %d expired or abandoned upload(s) deleted", n)
            except RedisError as exc:
                log.warning("upload sweeper: %s; retrying", exc)
            except Exception:
                log.exception("upload sweeper failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), SWEEP_S)
        with contextlib.suppress(RedisError):  # let another replica take over at once
            await self._scripts["renew"](keys=[keys.UPLOADS_SWEEPER], args=[self.me, 1])
