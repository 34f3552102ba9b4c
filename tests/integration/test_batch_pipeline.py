"""AsyncJobStore.create_many (the batch driver's one round trip per chunk) on a real Redis:
a chunk mixing accepted, rejected and refused lines answers each line as the one-line
scripts do, one at a time (what the driver ran before), and leaves the same counts."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio as aioredis

from tokenq.shared import keys
from tokenq.shared.jobs import (
    Created,
    CreateResult,
    Exists,
    NewJob,
    NewRejection,
    QueueFull,
    TenantFull,
    dumps,
)
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import JobErrorInfo
from tokenq.shared.settings import Settings
from tokenq.shared.store import AsyncJobStore

SETTINGS = Settings(stream_maxlen=1000, result_ttl_s=60)
# The chunk: True a line to create, False a line rejected at enqueue.
CHUNK = [True, True, False, True, True, False, True, True]


def chunk(run: str, queue_limit: int, tenant_limit: int) -> list[NewJob | NewRejection]:
    """The lines of batch `batch_<run>`, for tenant `t-<run>` on queue `q-<run>`."""
    batch, tenant, now = f"batch_{run}", f"t-{run}", time.time()
    out: list[NewJob | NewRejection] = []
    for n, ok in enumerate(CHUNK, 1):
        job_id = f"job_{run}_{n}"
        fields = {"id": job_id, "owner": tenant, "model": "m", "state": "queued",
                  "attempts": "0", "created_at": repr(now), "request": "{}", "batch": batch,
                  "custom_id": f"c{n}"}
        if ok:
            out.append(NewJob(job_id, fields, tenant, f"q-{run}",
                              dumps({"properties": {"delivery_tag": job_id}}), now,
                              queue_limit, tenant_limit))
        else:
            out.append(NewRejection(job_id, fields, tenant,
                                    JobErrorInfo(code="model_not_found", message="gone"), 60,
                                    now))
    return out


async def one_at_a_time(s: AsyncJobStore,
                        lines: list[NewJob | NewRejection]) -> list[CreateResult | bool]:
    """What the driver did before: one round trip per line."""
    out: list[CreateResult | bool] = []
    for x in lines:
        if isinstance(x, NewJob):
            out.append(await s.create(x.job_id, x.fields, tenant=x.tenant, queue=x.queue,
                                      message=x.message, queue_limit=x.queue_limit,
                                      tenant_limit=x.tenant_limit, now=x.now))
        else:
            out.append(await s.reject(x.job_id, x.fields, tenant=x.tenant, error=x.error,
                                      ttl=x.ttl))
    return out


def kinds(got: list[CreateResult | bool]) -> list[str]:
    return [type(x).__name__ if not isinstance(x, bool) else f"rejected={x}" for x in got]


@pytest.mark.parametrize(("queue_limit", "tenant_limit", "refusal"),
                         [(3, 0, QueueFull), (0, 3, TenantFull)],
                         ids=["queue-full", "tenant-full"])
def test_mixed_chunk_answers_each_line_as_one_at_a_time(
        redis_server: EmbeddedRedis, r: redis.Redis, queue_limit: int, tenant_limit: int,
        refusal: type) -> None:
    async def scenario() -> tuple[list[CreateResult | bool], list[CreateResult | bool],
                                  list[CreateResult | bool]]:
        client = aioredis.Redis(port=redis_server.port, db=15, decode_responses=True)
        try:
            s = AsyncJobStore(client, SETTINGS)
            before = await one_at_a_time(s, chunk("seq", queue_limit, tenant_limit))
            piped = await s.create_many(chunk("pipe", queue_limit, tenant_limit))
            again = await s.create_many(chunk("pipe", queue_limit, tenant_limit))
            return before, piped, again
        finally:
            await client.aclose()

    before, piped, again = asyncio.run(scenario())
    # the 4th line to create meets the limit (3): it and the creates after it are refused;
    # rejections are written wherever they sit
    assert kinds(piped) == kinds(before) == [
        "Created", "Created", "rejected=True", "Created", refusal.__name__, "rejected=True",
        refusal.__name__, refusal.__name__]
    assert piped == before  # depths and counts too
    assert [x.depth for x in piped if isinstance(x, Created)] == [0, 1, 2]
    # sent again (a restart rewinds to the cursor): nothing is written or counted twice
    assert kinds(again) == ["Exists", "Exists", "rejected=False", "Exists", refusal.__name__,
                            "rejected=False", refusal.__name__, refusal.__name__]
    assert all(isinstance(x, Exists) for x in again[:2])
    for run in ("seq", "pipe"):
        assert r.hget(keys.batch(f"batch_{run}"), "enqueued") == "5"  # 3 created, 2 rejected
        assert r.llen(f"q-{run}") == 3
        assert not r.exists(keys.job(f"job_{run}_5"))
        assert r.hget(keys.job(f"job_{run}_6"), "state") == "failed"


def test_empty_chunk_makes_no_round_trip(redis_server: EmbeddedRedis) -> None:
    async def scenario() -> list[CreateResult | bool]:
        client = aioredis.Redis(port=redis_server.port, db=15)
        try:
            return await AsyncJobStore(client, SETTINGS).create_many([])
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == []


def test_a_chunk_and_an_acked_create_survive_redis_forgetting_its_scripts(
        r: redis.Redis, redis_server: EmbeddedRedis) -> None:
    """After SCRIPT FLUSH (a restart or failover empties the cache) the pipelined creates
    come back refused, never run; they are run again in order, and the chunk answers as
    with a warm cache. So does `create_acked` (create + WAIT on one connection)."""
    async def scenario() -> tuple[list[CreateResult | bool], CreateResult, int]:
        client = aioredis.Redis(port=redis_server.port, db=15)
        try:
            s = AsyncJobStore(client, SETTINGS)
            await client.script_flush()
            lines = chunk("cold", 0, 0)
            got = await s.create_many(lines)
            await client.script_flush()
            first = lines[0]
            assert isinstance(first, NewJob)
            acked = await s.create_acked(
                "job_cold_acked", {**first.fields, "id": "job_cold_acked"}, tenant="t-cold",
                queue="q-cold", message=dumps({"properties": {"delivery_tag": "a"}}),
                replicas=0, timeout_ms=10)
            return got, *acked
        finally:
            await client.aclose()

    got, created, _ = asyncio.run(scenario())
    assert [type(x).__name__ if not isinstance(x, bool) else x for x in got] == [
        "Created", "Created", True, "Created", "Created", True, "Created", "Created"]
    assert isinstance(created, Created)
    assert r.llen("q-cold") == 7
