"""One shared XREAD reader per API process, fanned out to every open SSE stream.

Why shared: one XREAD over the watched streams costs one Redis connection and one round
trip per batch of events, however many clients are connected, so event latency stays flat
as streams are added (figures in docs/benchmarks.md, "Figures behind code choices").

Which streams a read names (`tokenq.api.stream_notify`):
- notified (the default): only those whose pub/sub channel announced new entries since
  the last read (api/stream_notify.py), and every watched stream once per
  `full_read_ms`, which delivers whatever a lost or missing hint left behind. Redis'
  cost per read is the streams that moved. A worker's token write carries its entries
  in the announcement: when they start at the hub's cursor they are delivered with no
  read (`_hint`), so a running job's tokens cost the API one wake-up each.
- blocking: an XREAD BLOCK over every watched stream (and a private wake stream that a
  new subscriber writes to). Inside Redis each wake-up walks all of them.

How a subscriber joins without a gap or a duplicate:
1. It registers first. If the stream is new to the hub, the hub's cursor for
   it starts at the subscriber's resume point, and the reader (woken at once)
   delivers everything after it.
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
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tokenq.api.stream_ids import is_valid_id, parse_id
from tokenq.api.stream_notify import StreamNotifier
from tokenq.shared import aio, keys
from tokenq.shared.redis_conn import async_client
from tokenq.shared.schemas import TERMINAL_EVENTS
from tokenq.shared.settings import Settings

log = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str]]
HUB_TIMEOUT_MARGIN_S = 10.0


def announced_entries(message: str, cursor: str) -> list[Entry]:
    """The entries a token write announced (shared/lua/append.lua: JSON [prev, id, [k, v,
    ...], ...]) when they start right after `cursor`, else []: the caller reads instead."""
    if not message:
        return []
    try:
        got = json.loads(message)
    except ValueError:
        return []
    if (not isinstance(got, list) or len(got) < 3 or len(got) % 2 != 1
            or got[0] != cursor):
        return []
    entries: list[Entry] = []
    for i in range(1, len(got), 2):
        entry_id, flat = got[i], got[i + 1]
        if (not isinstance(entry_id, str) or not isinstance(flat, list) or len(flat) % 2
                or not all(isinstance(x, str) for x in flat)):
            return []
        entries.append((entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return entries


class BadCursor(Exception):
    """Redis refused a stream cursor: the subscribers of that stream alone are ended."""


# The hub's client holds this many connections; catch-up reads (XRANGE, a subscriber that
# joins a stream others watch, a replay from Last-Event-ID) take at most RANGE_READS of them
# at once and wait their turn beyond: 96 replays of one long job at once ran the pool out
# (MaxConnectionsError), and dozens of streams ended cut mid-body.
HUB_CONNECTIONS = 16
RANGE_READS = 8


def hub_client(settings: Settings, block_ms: int) -> aioredis.Redis:
    """The hub's own client. With stream announcements (stream_notify, the default) its
    XREADs never BLOCK, so it has every client's socket timeout (redis_socket_timeout_s):
    a primary cut off the network is left within that, and the streams resume on the
    promoted one. Without them, its timeout is BLOCK plus a margin: an idle XREAD then
    ends with Redis' empty reply at BLOCK, never a client-side "Timeout reading" that
    drops the connection (and, retried, logs every few seconds); a dead server is still
    noticed within BLOCK + margin."""
    timeout = settings.redis_socket_timeout_s if settings.api.stream_notify \
        else block_ms / 1000 + HUB_TIMEOUT_MARGIN_S
    return async_client(
        settings, decode_responses=True, max_connections=HUB_CONNECTIONS,
        health_check_interval=30,
        socket_timeout=timeout, socket_connect_timeout=settings.redis_connect_timeout_s,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[RedisConnectionError])


@dataclass(eq=False)
class _Sub:
    """One subscriber's inbox: what asyncio.Queue does here, at less per entry (no getters
    list, no loop lookup per get): the hub puts, one reader gets."""
    # None: Redis refused this stream's cursor; the subscription ends with BadCursor.
    items: deque[Entry | None] = field(default_factory=deque)
    waiter: asyncio.Future[None] | None = None

    def put(self, item: Entry | None) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self) -> Entry | None:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.items.popleft()


class StreamHub:
    def __init__(self, redis: aioredis.Redis, *, block_ms: int = 5000, count: int = 500,
                 read_gap_ms: int = 0, notify: bool = False, full_read_ms: int = 1000):
        """`redis`: a client whose socket timeout (if any) exceeds `block_ms` (see
        `hub_client`): otherwise every idle BLOCK ends in a client-side timeout.
        `read_gap_ms`: after a read that returned entries, the next starts no sooner than
        this after it. Each XREAD walks every watched stream inside Redis, so this bounds
        Redis' cost to (streams watched) x (1000 / gap) walks a second, for at most that
        much more latency per event (0: read again at once).
        `notify`: read only the streams announced on their pub/sub channels, and all of
        them every `full_read_ms` (else: XREAD BLOCK over all, `block_ms` at a time)."""
        self._redis = redis
        self._block_ms = block_ms
        self._read_gap_s = read_gap_ms / 1000
        self._count = count
        self._subs: dict[str, set[_Sub]] = {}
        self._cursor: dict[str, str] = {}
        self._wake_key = keys.api_wake(uuid.uuid4().hex)
        self._wake_cursor = "0-0"
        self._has_subs = asyncio.Event()
        self._notifier = StreamNotifier(redis, self._hint) if notify else None
        self._full_read_s = full_read_ms / 1000
        self._dirty: set[str] = set()
        self._dirty_event = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # Awaited before a terminal entry reaches a subscriber (durable.settle_terminal).
        self.before_terminal: Callable[[str], Awaitable[None]] | None = None
        self.carried = 0  # entries delivered straight from their announcement (no read)
        self._range_reads = asyncio.Semaphore(RANGE_READS)

    @property
    def watched(self) -> int:
        return len(self._subs)

    async def start(self) -> None:
        if self._notifier is not None:
            await self._notifier.start()
            self._task = asyncio.create_task(self._run_notified(), name="tokenq-stream-hub")
            return
        self._wake_cursor = str(await self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=10))
        await self._redis.expire(self._wake_key, 86400)
        self._task = asyncio.create_task(self._run(), name="tokenq-stream-hub")

    async def stop(self) -> None:
        """Stop cooperatively: a wake entry returns the blocking XREAD at once. (Cancelling
        a redis-py command mid-read is avoided: it can leave the connection pool stuck.)"""
        self._closing = True
        self._has_subs.set()
        await self._wake()
        if self._notifier is not None:
            await self._notifier.stop()
        if self._task:
            await aio.stop(self._task, 3)
        if self._notifier is None:
            with contextlib.suppress(RedisError):
                await self._redis.delete(self._wake_key)

    async def _wake(self) -> None:
        if self._notifier is not None:
            self._dirty_event.set()
            return
        with contextlib.suppress(RedisError):
            await self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=10)

    def _hint(self, key: str, message: str = "") -> None:
        """`key` has new entries (or was just subscribed): delivered here if `message`
        carries them from where this hub's cursor is, else the next read names the key."""
        cursor = self._cursor.get(key)
        if cursor is None:
            return
        entries = announced_entries(message, cursor)
        if entries:
            self._deliver([(key, entries)])
            self.carried += len(entries)
            return
        self._dirty.add(key)
        self._dirty_event.set()

    async def _run(self) -> None:
        while not self._closing:
            if not self._subs:
                self._has_subs.clear()
                await self._has_subs.wait()
                continue
            streams: dict[Any, Any] = {self._wake_key: self._wake_cursor, **self._cursor}
            started = asyncio.get_running_loop().time()
            ok, resp = await self._xread(streams, self._block_ms)
            if not ok:
                continue
            for key, entries in resp or []:
                if key == self._wake_key:
                    self._wake_cursor = entries[-1][0]
            self._deliver(resp)
            if resp and self._read_gap_s:
                await asyncio.sleep(started + self._read_gap_s - asyncio.get_running_loop().time())

    async def _run_notified(self) -> None:
        loop = asyncio.get_running_loop()
        next_full = 0.0
        while not self._closing:
            if not self._subs:
                self._has_subs.clear()
                await self._has_subs.wait()
                continue
            started = loop.time()
            if started >= next_full:
                names = list(self._cursor)  # every watched stream: what no hint announced
                next_full = started + self._full_read_s
            elif self._dirty:
                names = [key for key in self._dirty if key in self._cursor]
            else:
                self._dirty_event.clear()
                with contextlib.suppress(TimeoutError):  # a timeout scope, not a task a wait
                    async with asyncio.timeout(next_full - started):
                        await self._dirty_event.wait()
                continue
            self._dirty.clear()
            if not names:
                continue
            ok, resp = await self._xread({key: self._cursor[key] for key in names}, None)
            if not ok:
                self._dirty.update(names)  # not read: name them again
                continue
            self._deliver(resp)
            for key, entries in resp or []:
                if len(entries) >= self._count:
                    self._dirty.add(key)  # a page: more may wait
            if resp and self._read_gap_s:
                await asyncio.sleep(started + self._read_gap_s - loop.time())

    async def _xread(self, streams: dict[Any, Any], block_ms: int | None) -> tuple[bool, Any]:
        """One XREAD: (True, its reply), or (False, None) after a failure, handled here
        (logged, waited on, or the bad cursors' subscribers ended): the caller reads again."""
        try:
            return True, await self._redis.xread(streams, block=block_ms, count=self._count)
        except ResponseError as exc:
            # Redis refused the command itself (a cursor it cannot parse): retrying the
            # same XREAD would stall every stream here. End only the bad cursor's
            # subscribers.
            log.warning("stream hub: XREAD refused (%s); checking each cursor", exc)
            await self._drop_bad_cursors()
        except RedisTimeoutError as exc:
            # Not an idle wait (that ends at BLOCK with an empty reply): Redis gave no
            # answer for BLOCK + the margin.
            log.warning("stream hub: Redis did not answer XREAD in time (%s); again", exc)
        except RedisError as exc:
            log.warning("stream hub: XREAD failed (%s); retrying", exc)
            await asyncio.sleep(0.5)
        return False, None

    def _deliver(self, resp: Any) -> None:
        for key, entries in resp or []:
            subs = self._subs.get(key)
            if not subs:
                continue
            for entry in entries:
                for sub in subs:
                    sub.put(entry)
            if parse_id(entries[-1][0]) > parse_id(self._cursor.get(key, "0-0")):
                self._cursor[key] = entries[-1][0]

    async def _drop_bad_cursors(self) -> None:
        """Ask Redis about each cursor alone (no BLOCK: answers at once); a stream whose
        cursor it refuses loses its subscribers (each gets BadCursor), the rest go on."""
        bad = 0
        for key, cursor in list(self._cursor.items()):
            try:
                await self._redis.xread({key: cursor}, count=1)
            except ResponseError as exc:
                bad += 1
                log.warning("stream hub: Redis refused cursor %r of %s (%s); ending its "
                            "subscribers", cursor, key, exc)
                self._cursor.pop(key, None)
                for sub in self._subs.pop(key, set()):
                    sub.put(None)
                if self._notifier is not None:
                    self._notifier.unwant(key)
            except RedisError:
                pass  # not this cursor's fault: the main loop's retry handles it
        if not bad:
            await asyncio.sleep(0.5)  # refused for another reason: do not spin

    async def subscribe(self, key: str, after: str | None) -> AsyncIterator[Entry]:
        """Every entry of stream `key` after `after` (all when None), until a terminal event.
        Raises ValueError for a malformed `after` (before anything is registered) and
        BadCursor if Redis refuses this stream's cursor."""
        if after is not None and not is_valid_id(after):
            raise ValueError(f"not a stream id: {after!r}")
        last = after or "0-0"
        sub = _Sub()
        catch_up_to = self._cursor.get(key)
        self._subs.setdefault(key, set()).add(sub)
        if catch_up_to is None:
            self._cursor[key] = last  # a new stream: the reader starts at our resume point
            if self._notifier is not None:
                self._notifier.want(key)
                self._hint(key)
        self._has_subs.set()
        await self._wake()
        try:
            if catch_up_to is not None and parse_id(catch_up_to) > parse_id(last):
                async for entry in self._range(key, last, catch_up_to):
                    last = entry[0]
                    if entry[1].get("e") in TERMINAL_EVENTS:
                        await self._settle(key)
                        yield entry
                        return
                    yield entry
            last_at = parse_id(last)
            while True:
                got = await sub.get()
                if got is None:
                    raise BadCursor(f"Redis refused the cursor of {key}")
                entry = got
                at = parse_id(entry[0])
                if at <= last_at:
                    continue
                last_at = at
                if entry[1].get("e") in TERMINAL_EVENTS:
                    await self._settle(key)
                    yield entry
                    return
                yield entry
        finally:
            subs = self._subs.get(key)
            if subs is not None and sub in subs:
                subs.discard(sub)
                if not subs:
                    del self._subs[key]
                    self._cursor.pop(key, None)
                    if self._notifier is not None:
                        self._notifier.unwant(key)

    async def _settle(self, key: str) -> None:
        if self.before_terminal is not None:
            await self.before_terminal(f"stream {key}")

    async def _range(self, key: str, after: str, upto: str) -> AsyncIterator[Entry]:
        start = "(" + after
        while True:
            async with self._range_reads:
                batch: Any = await self._redis.xrange(key, min=start, max=upto,
                                                      count=self._count)
            for entry in batch:
                yield entry
            if len(batch) < self._count:
                return
            start = "(" + batch[-1][0]
