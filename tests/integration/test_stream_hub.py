"""The API's shared XREAD reader: many subscribers, joins mid-stream, no gap, no duplicate."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from api.streams import StreamHub
from shared.redis_server import EmbeddedRedis


async def collect(hub: StreamHub, key: str, after: str | None) -> list[str]:
    return [f["n"] async for _, f in hub.subscribe(key, after)]


def test_subscribers_joining_at_any_point_see_every_entry_once(
        redis_server: EmbeddedRedis) -> None:
    asyncio.run(_scenario(redis_server.port))


async def _scenario(port: int) -> None:
    r = aioredis.Redis(port=port, db=14, decode_responses=True)
    await r.flushdb()
    hub = StreamHub(r, block_ms=200, count=7)  # small count: exercises paging
    await hub.start()
    try:
        keys = [f"s{i}" for i in range(5)]
        n = 60

        async def writer(key: str) -> None:
            for i in range(n):
                await r.xadd(key, {"e": "token", "n": str(i)})
                if i % 5 == 0:
                    await asyncio.sleep(0.005)
            await r.xadd(key, {"e": "done", "n": str(n)})

        expected = [str(i) for i in range(n + 1)]
        early = [asyncio.create_task(collect(hub, k, None)) for k in keys]
        writers = [asyncio.create_task(writer(k)) for k in keys]
        await asyncio.sleep(0.02)
        mid = [asyncio.create_task(collect(hub, k, None)) for k in keys]  # join mid-stream
        await asyncio.gather(*writers)
        late = [asyncio.create_task(collect(hub, k, None)) for k in keys]  # after done
        for result in await asyncio.gather(*early, *mid, *late):
            assert result == expected
        # resume from the middle of a finished stream
        entries = await r.xrange("s0")
        resumed = await collect(hub, "s0", entries[10][0])
        assert resumed == expected[11:]
        assert hub.watched == 0
    finally:
        await hub.stop()
        await r.aclose()
