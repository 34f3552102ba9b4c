"""The API's shared XREAD reader: many subscribers, joins mid-stream, no gap, no duplicate."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from tokenq.api.streams import StreamHub
from tokenq.shared.redis_server import EmbeddedRedis

# A subscriber that misses an entry (or its stream's end) waits for it forever: every wait
# here has a deadline, so such a loss fails in seconds instead of hanging the run.
WAIT_S = 30.0


async def collect(hub: StreamHub, key: str, after: str | None) -> list[str]:
    return [f["n"] async for _, f in hub.subscribe(key, after)]


@pytest.mark.parametrize("notify", [False, True], ids=["blocking", "notified"])
@pytest.mark.parametrize("gap_ms", [0, 20])
def test_subscribers_joining_at_any_point_see_every_entry_once(
        redis_server: EmbeddedRedis, gap_ms: int, notify: bool) -> None:
    asyncio.run(_scenario(redis_server.port, gap_ms, notify))


async def _scenario(port: int, gap_ms: int, notify: bool) -> None:
    r = aioredis.Redis(port=port, db=14, decode_responses=True)
    await r.flushdb()
    # small count: exercises paging; notified: hints only (no full read after the first)
    hub = StreamHub(r, block_ms=200, count=7, read_gap_ms=gap_ms, notify=notify,
                    full_read_ms=60_000)
    await hub.start()
    try:
        keys = [f"s{i}" for i in range(5)]
        n = 60

        async def writer(key: str) -> None:
            for i in range(n):
                await r.xadd(key, {"e": "token", "n": str(i)})
                await r.publish(key, "")  # as the job scripts do
                if i % 5 == 0:
                    await asyncio.sleep(0.005)
            await r.xadd(key, {"e": "done", "n": str(n)})
            await r.publish(key, "")

        expected = [str(i) for i in range(n + 1)]
        early = [asyncio.create_task(collect(hub, k, None)) for k in keys]
        writers = [asyncio.create_task(writer(k)) for k in keys]
        await asyncio.sleep(0.02)
        mid = [asyncio.create_task(collect(hub, k, None)) for k in keys]  # join mid-stream
        await asyncio.wait_for(asyncio.gather(*writers), WAIT_S)
        late = [asyncio.create_task(collect(hub, k, None)) for k in keys]  # after done
        for result in await asyncio.wait_for(asyncio.gather(*early, *mid, *late), WAIT_S):
            assert result == expected
        # resume from the middle of a finished stream
        entries = await r.xrange("s0")
        resumed = await asyncio.wait_for(collect(hub, "s0", entries[10][0]), WAIT_S)
        assert resumed == expected[11:]
        assert hub.watched == 0
    finally:
        await hub.stop()
        await r.aclose()


@pytest.mark.parametrize("notify", [False, True], ids=["blocking", "notified"])
def test_a_read_gap_bounds_the_reads_and_loses_nothing(redis_server: EmbeddedRedis,
                                                       notify: bool) -> None:
    """`stream_read_gap_ms`: one XREAD per gap at most while entries keep coming (each walks
    every watched stream inside Redis), every entry still delivered once, in order."""
    asyncio.run(_gap_scenario(redis_server.port, notify))


async def _gap_scenario(port: int, notify: bool) -> None:
    r = aioredis.Redis(port=port, db=14, decode_responses=True)
    await r.flushdb()
    calls = 0
    xread = r.xread

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await xread(*args, **kwargs)

    r.xread = counted  # type: ignore[method-assign]
    hub = StreamHub(r, block_ms=200, read_gap_ms=50, notify=notify, full_read_ms=60_000)
    await hub.start()
    try:
        n = 50
        reader = asyncio.create_task(collect(hub, "g", None))
        await asyncio.sleep(0.1)
        calls, t0 = 0, time.monotonic()
        for i in range(n):
            await r.xadd("g", {"e": "token", "n": str(i)})
            await r.publish("g", "")
            await asyncio.sleep(0.005)
        await r.xadd("g", {"e": "done", "n": str(n)})
        await r.publish("g", "")
        assert await asyncio.wait_for(reader, WAIT_S) == [str(i) for i in range(n + 1)]
        took = time.monotonic() - t0
        assert calls <= took / 0.05 + 3, (calls, took)  # without the gap: about one per write
    finally:
        await hub.stop()
        await r.aclose()


def test_many_replays_of_one_stream_share_the_hubs_connections(
        redis_server: EmbeddedRedis) -> None:
    """96 subscribers replaying one long finished stream from its start, on a client of 16
    connections: each reads every entry. Before, their catch-up reads ran the client's pool
    out (MaxConnectionsError) and dozens of streams ended cut."""
    asyncio.run(_replays(redis_server.port))


async def _replays(port: int) -> None:
    r = aioredis.Redis(port=port, db=14, decode_responses=True, max_connections=16)
    await r.flushdb()
    hub = StreamHub(r, block_ms=200, count=50, notify=True, full_read_ms=60_000)
    await hub.start()
    try:
        n = 2000
        async with r.pipeline(transaction=False) as pipe:
            for i in range(n):
                pipe.xadd("long", {"e": "token", "n": str(i)})
            pipe.xadd("long", {"e": "done", "n": str(n)})
            await pipe.execute()
        last_id = (await r.xrevrange("long", count=1))[0][0]
        expected = [str(i) for i in range(n + 1)]
        gate = asyncio.Event()

        async def held() -> list[str]:  # watches the stream, and holds it watched
            out: list[str] = []
            async for _, f in hub.subscribe("long", None):
                out.append(f["n"])
                if len(out) == 1:
                    await gate.wait()
            return out

        first = asyncio.create_task(held())
        deadline = time.monotonic() + WAIT_S
        while hub._cursor.get("long") != last_id:  # the hub has read it all
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        # the others join a stream the hub has read: they catch up with XRANGE
        others = [asyncio.create_task(collect(hub, "long", None)) for _ in range(95)]
        results = await asyncio.wait_for(asyncio.gather(*others), WAIT_S)
        assert all(got == expected for got in results), [len(g) for g in results]
        gate.set()
        assert await asyncio.wait_for(first, WAIT_S) == expected
    finally:
        await hub.stop()
        await r.flushdb()
        await r.aclose()
