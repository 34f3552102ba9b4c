"""The batch driver's Redis protocol: its lease on a batch, settling and releasing it.

The scripts are shared/lua/renew.lua, settle.lua (the job scripts' own settle, for
batches whose lines all ended before the driver finished), release.lua, batch_files.lua
(an older API's finished batch registers its output files on read), batch_cancel.lua and
batch_unrun.lua (the lines a cancel left unenqueued).
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from tokenq.api.openai.batch_lines import line_job_id
from tokenq.shared import keys
from tokenq.shared.lua_scripts import Scripts

LEASE_MS = 30_000


class BatchStore:
    def __init__(self, r: aioredis.Redis, owner: str):
        self.r = r
        self.owner = owner  # this driver's lease value
        self._scripts = Scripts(r, ("renew", "settle", "release", "batch_files",
                                       "batch_cancel", "batch_unrun"))

    async def pending(self) -> list[str]:
        """Batches a driver must work on, in id order."""
        ids: set[str] = await self.r.smembers(keys.BATCHES_PENDING)  # type: ignore[assignment]
        return sorted(ids)

    async def take_lease(self, batch_id: str) -> bool:
        return bool(await self.r.set(keys.batch_driver(batch_id), self.owner, nx=True,
                                     px=LEASE_MS))

    async def renew_lease(self, batch_id: str) -> bool:
        return bool(await self._scripts["renew"](keys=[keys.batch_driver(batch_id)],
                                                 args=[self.owner, LEASE_MS]))

    async def drop_lease(self, batch_id: str) -> None:
        await self.r.delete(keys.batch_driver(batch_id))

    async def settle(self, batch_id: str) -> str | None:
        """Settle the batch if its lines have all ended; its status, None if it is gone."""
        status = await self._scripts["settle"](keys=[keys.batch(batch_id)],
                                               args=[repr(time.time())])
        return str(status) if status else None

    async def release(self, batch_id: str) -> bool:
        """Out of the pending set when nothing is left for a driver to do."""
        return bool(await self._scripts["release"](
            keys=[keys.batch(batch_id), keys.BATCHES_PENDING], args=[batch_id]))

    async def cancel(self, batch_id: str) -> str | None:
        """`cancelling` if it is still validating or in progress; the status it found."""
        status = await self._scripts["batch_cancel"](
            keys=[keys.batch(batch_id), keys.BATCHES_PENDING],
            args=[batch_id, repr(time.time())])
        return str(status) if status else None

    async def unrun(self, batch_id: str, lines: list[tuple[int, str]]) -> int:
        """Lines (number, custom_id) a cancel left unenqueued, counted `cancelled` as
        entries of the batch's error file: how many were counted (a line with a job, or
        counted by an earlier sweep, is not)."""
        if not lines:
            return 0
        job_keys = [keys.job(line_job_id(batch_id, n)) for n, _ in lines]
        args: list[str] = [repr(time.time())]
        for n, custom_id in lines:
            args += [str(n), custom_id]
        return int(await self._scripts["batch_unrun"](keys=[keys.batch(batch_id), *job_keys],
                                                      args=args))

    async def register_files(self, batch_id: str, files_key: str, ttl: int) -> bool:
        """A finished batch's output and error files as file objects, if not yet (once)."""
        return bool(await self._scripts["batch_files"](
            keys=[keys.batch(batch_id), files_key], args=[repr(time.time()), ttl]))
