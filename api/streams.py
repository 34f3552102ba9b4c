"""One shared XREAD BLOCK reader per API process, fanned out to every open SSE stream.

Why shared: one blocking XREAD over all watched streams costs one Redis
connection and one round trip per batch of events, however many clients are
connected, so event latency stays flat as streams are added (figures in
docs/benchmarks.md, "Figures behind code choices").

How a subscriber joins without a gap or a duplicate:
1. It registers first. If the stream is new to the hub, the hub's cursor for
   it starts at the subscriber's resume point, and the reader (woken through a
   private wake stream) delivers everything after it.
2. If the hub already reads that stream at cursor `c`, the reader will deliver
   everything after `c` to the new subscriber from now on; the subscriber reads
   (resume point, c] itself with XRANGE.
3. The subscriber drops any entry at or before the last id it yielded.
Each registration and each delivery runs on the one event loop, so step 2's
`c` and the reader's deliveries cannot interleave badly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from shared import keys
from shared.schemas import TERMINAL_EVENTS

log = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str]]


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def is_valid_id(entry_id: str) -> bool:
    try:
        parse_id(entry_id)
    except ValueError:
        return False
    return True


@dataclass(eq=False)
class _Sub:
    queue: asyncio.Queue[Entry] = field(default_factory=asyncio.Queue)


class StreamHub:
    def __init__(self, redis: aioredis.Redis, *, block_ms: int = 5000, count: int = 500):
        self._redis = redis
        self._block_ms = block_ms
        self._count = count
        self._subs: dict[str, set[_Sub]] = {}
        self._cursor: dict[str, str] = {}
        self._wake_key = keys.api_wake(uuid.uuid4().hex)
        self._wake_cursor = "0-0"
        self._has_subs = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def watched(self) -> int:
        return len(self._subs)

    async def start(self) -> None:
        self._wake_cursor = str(await self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=10))
        await self._redis.expire(self._wake_key, 86400)
        self._task = asyncio.create_task(self._run(), name="tokenq-stream-hub")

    async def stop(self) -> None:
        """Stop cooperatively: a wake entry returns the blocking XREAD at once. (Cancelling
        a redis-py command mid-read is avoided: it can leave the connection pool stuck.)"""
        self._closing = True
        self._has_subs.set()
        await self._wake()
        if self._task:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout=3)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        with contextlib.suppress(RedisError):
            await self._redis.delete(self._wake_key)

    async def _wake(self) -> None:
        with contextlib.suppress(RedisError):
            await self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=10)

    async def _run(self) -> None:
        while not self._closing:
            if not self._subs:
                self._has_subs.clear()
                await self._has_subs.wait()
                continue
            streams: dict[Any, Any] = {self._wake_key: self._wake_cursor, **self._cursor}
            try:
                resp: Any = await self._redis.xread(streams, block=self._block_ms,
                                                    count=self._count)
            except RedisError as exc:
                log.warning("stream hub: XREAD failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            for key, entries in resp or []:
                if key == self._wake_key:
                    self._wake_cursor = entries[-1][0]
                    continue
                subs = self._subs.get(key)
                if not subs:
                    continue
                for entry in entries:
                    for sub in subs:
                        sub.queue.put_nowait(entry)
                if parse_id(entries[-1][0]) > parse_id(self._cursor.get(key, "0-0")):
                    self._cursor[key] = entries[-1][0]

    async def subscribe(self, key: str, after: str | None) -> AsyncIterator[Entry]:
        """Every entry of stream `key` after `after` (all when None), until a terminal event."""
        last = after or "0-0"
        sub = _Sub()
        catch_up_to = self._cursor.get(key)
        self._subs.setdefault(key, set()).add(sub)
        if catch_up_to is None:
            self._cursor[key] = last  # a new stream: the reader starts at our resume point
        self._has_subs.set()
        await self._wake()
        try:
            if catch_up_to is not None and parse_id(catch_up_to) > parse_id(last):
                async for entry in self._range(key, last, catch_up_to):
                    last = entry[0]
                    yield entry
                    if entry[1].get("e") in TERMINAL_EVENTS:
                        return
            while True:
                entry = await sub.queue.get()
                if parse_id(entry[0]) <= parse_id(last):
                    continue
                last = entry[0]
                yield entry
                if entry[1].get("e") in TERMINAL_EVENTS:
                    return
        finally:
            subs = self._subs.get(key)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[key]
                    self._cursor.pop(key, None)

    async def _range(self, key: str, after: str, upto: str) -> AsyncIterator[Entry]:
        start = "(" + after
        while True:
            batch: Any = await self._redis.xrange(key, min=start, max=upto, count=self._count)
            for entry in batch:
                yield entry
            if len(batch) < self._count:
                return
            start = "(" + batch[-1][0]
