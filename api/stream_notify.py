"""Which watched streams have grown: Redis pub/sub hints for the API's stream hub.

Every job script that adds to a job's stream also PUBLISHes on a channel named like the
stream (`tokenq:job:{id}:events`, shared/lua/). The hub subscribes to the channels of the
streams it watches and reads only those that were announced, so Redis' cost per read is
the streams that moved, not every stream the replica watches (a shared XREAD walks all of
its keys: docs/operations.md, "Sizing Redis for SSE streams"). A worker's token writes
carry the entries themselves (shared/lua/append.lua): where the hub's cursor is where
they start, it delivers them with no read at all.

A hint is never the only way an entry reaches a client: messages sent while this
connection was down are gone, and a worker from before this change publishes nothing.
So (1) each channel's subscribe confirmation counts as a hint (a read after it sees
everything written before the subscription), and (2) the hub still reads every watched
stream at a fixed interval.

One connection, owned by this object: a reader task reads every reply (messages,
confirmations, pongs) and reconnects on any error; a writer task sends SUBSCRIBE and
UNSUBSCRIBE for what changed since its last send. After a reconnect the writer subscribes
everything wanted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from tokenq.shared import aio

try:  # the value redis-py's hiredis reader returns for "no complete reply yet"
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - a redis-py without it: replies are read one by one
    _NOT_ENOUGH_DATA = None

log = logging.getLogger(__name__)

# A quiet connection is pinged after this; no reply within it again: reconnect.
IDLE_PING_S = 10.0
# Channels per SUBSCRIBE / UNSUBSCRIBE command.
CHUNK = 512
# Redis refused a subscription (an ACL user without the channels): try again this much later.
REFUSED_RETRY_S = 30.0


class StreamNotifier:
    def __init__(self, redis: aioredis.Redis, on_hint: Callable[[str, str], None],
                 *, idle_ping_s: float = IDLE_PING_S) -> None:
        """`on_hint(channel, message)` runs on the event loop for every message and every
        subscribe confirmation (message "")."""
        self._redis = redis
        self._on_hint = on_hint
        self._idle_ping_s = idle_ping_s
        self._conn: Any = None
        self._wanted: set[str] = set()
        self._applied: set[str] = set()  # subscribed (sent) on the current connection
        self._to_add: set[str] = set()
        self._to_remove: set[str] = set()
        self._changed = asyncio.Event()
        self._ready = asyncio.Event()  # connected; the writer may send
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self.reconnects = 0

    def want(self, channel: str) -> None:
        self._wanted.add(channel)
        self._to_remove.discard(channel)
        if channel not in self._applied:
            self._to_add.add(channel)
            self._changed.set()

    def unwant(self, channel: str) -> None:
        self._wanted.discard(channel)
        self._to_add.discard(channel)
        if channel in self._applied:
            self._to_remove.add(channel)
            self._changed.set()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._read(), name="tokenq-stream-notify-read"),
                       asyncio.create_task(self._write(), name="tokenq-stream-notify-write")]

    async def stop(self) -> None:
        self._closing = True
        for task in self._tasks:
            await aio.stop(task, 0)
        await self._drop()

    async def _drop(self) -> None:
        """Close the connection and give it back (a later connect makes a fresh one)."""
        self._ready.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
            with contextlib.suppress(Exception):
                await self._redis.connection_pool.release(conn)

    async def _connect(self) -> None:
        pool: Any = self._redis.connection_pool  # (redis-py leaves this one untyped)
        self._conn = await pool.get_connection()
        self._applied = set()
        self._to_remove = set()
        self._to_add = set(self._wanted)
        self._ready.set()
        self._changed.set()

    async def _read(self) -> None:
        delay = 0.05
        pinged = False
        while not self._closing:
            try:
                if self._conn is None:
                    await self._connect()
                    pinged = False
                # push_request: a message is this read's answer, not passed to redis-py's
                # own push handler
                reply = await self._conn.read_response(timeout=self._idle_ping_s,
                                                       disconnect_on_error=False,
                                                       push_request=True)
                if reply is None:  # quiet for idle_ping_s
                    if pinged:
                        raise ConnectionError("no reply to PING")
                    await self._conn.send_command("PING", check_health=False)
                    pinged = True
                    continue
                self._handle(reply)
                for reply in _parsed_replies(self._conn):
                    if isinstance(reply, Exception):
                        raise reply
                    self._handle(reply)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: a fresh connection, all subscribed again
                if self._closing:
                    return
                if isinstance(exc, ResponseError):  # e.g. NOPERM: retrying soon cannot help
                    delay = REFUSED_RETRY_S
                    log.warning("stream notifications: Redis refused (%s); streams are read "
                                "at the full-read interval only. The API's Redis user needs "
                                "the channels tokenq:job:* (ACL: &tokenq:job:*)", exc)
                else:
                    log.warning("stream notifications: %s; reconnecting in %.2f s", exc,
                                delay)
                await self._drop()
                self.reconnects += 1
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)
                continue
            delay = 0.05
            pinged = False

    def _handle(self, reply: Any) -> None:
        if isinstance(reply, list) and len(reply) >= 3:
            if reply[0] == "message":
                self._on_hint(reply[1], reply[2] if isinstance(reply[2], str) else "")
            elif reply[0] == "subscribe":
                self._on_hint(reply[1], "")

    async def _write(self) -> None:
        while not self._closing:
            await self._changed.wait()
            await self._ready.wait()
            self._changed.clear()
            add, self._to_add = self._to_add, set()
            remove, self._to_remove = self._to_remove, set()
            conn = self._conn
            try:
                for command, channels in (("SUBSCRIBE", sorted(add)),
                                          ("UNSUBSCRIBE", sorted(remove))):
                    for i in range(0, len(channels), CHUNK):
                        await conn.send_command(command, *channels[i:i + CHUNK],
                                                check_health=False)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The reader sees the broken connection and reconnects; a new connection
                # subscribes everything wanted, so nothing taken here is lost.
                log.warning("stream notifications: sending (un)subscribe failed: %s", exc)
                if conn is self._conn and conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.disconnect()
                continue
            if conn is not self._conn:
                continue
            self._applied |= add
            self._applied -= remove
            # want/unwant calls made while the commands were on their way: queue the undo
            for channel in add - self._wanted:
                self.unwant(channel)
            for channel in remove & self._wanted:
                self.want(channel)


def _parsed_replies(conn: Any) -> Iterator[Any]:
    """The replies already complete in the connection's hiredis buffer, taken without an
    await or a timeout scope each (a busy stream hub gets hundreds of messages per socket
    read: redis-py's read_response enters a timeout scope per reply, which was most of the
    notifier's cost per token). Nothing when the parser is not hiredis's."""
    reader = getattr(getattr(conn, "_parser", None), "_reader", None)
    if reader is None or _NOT_ENOUGH_DATA is None:
        return
    while (reply := reader.gets()) is not _NOT_ENOUGH_DATA and reply is not False:
        yield reply
