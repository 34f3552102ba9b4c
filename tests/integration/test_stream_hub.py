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
