"""Stream hints over pub/sub (api/stream_notify.py): the job scripts announce every write
on the stream's channel, and the hub reads only the streams announced, with a full read
now and then for whatever a hint missed. On one real Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from tokenq.api.streams import StreamHub
from tokenq.shared import keys
from tokenq.shared.jobs import Acquired, Ending, TokenWrite, dumps
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Finished, StepOutput, TokenDelta
from tokenq.workers.publisher import Publisher

SLOW_FULL_READ_MS = 60_000  # hints alone must carry the test


def running_job(store: JobStore, job: str) -> Acquired:
    """`job` created (32 tokens at most) and acquired by worker w1."""
    spec = JobSpec(prompt="hi", params=SamplingParams(
        max_tokens=32, temperature=0, top_p=1, top_k=0, repetition_penalty=1))
    store.create(job, {"id": job, "owner": "t", "model": "m", "state": "queued",
                       "attempts": "0", "created_at": repr(time.time()),
                       "spec": spec.model_dump_json(), "request": "{}"},
                 tenant="t", queue="q", message=dumps({"properties": {"delivery_tag": job}}))
    got = store.acquire(job, "w1")
    assert isinstance(got, Acquired)
    return got


def test_every_script_that_writes_a_stream_announces_it(r: redis.Redis) -> None:
    """create (queued), acquire (started), append (tokens, once per call) and the terminal
    write (done) each PUBLISH on the stream's channel."""
    job = "job_notify"
    channel = keys.job_events(job)
    sub = r.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    store = JobStore(r, Settings(stream_maxlen=1000, result_ttl_s=60,
                                 worker=WorkerSettings(lease_ttl_s=60, max_attempts=3)))
    got = running_job(store, job)
    publisher = Publisher(store)
    publisher.track(job, got.attempt)
    publisher.start()
    try:
        for step in (StepOutput([TokenDelta(job, got.attempt, i, f"t{i}", 100 + i)
                                 for i in (0, 1)], []),
                     StepOutput([TokenDelta(job, got.attempt, 2, "t2", 102)],
                                [Finished(job, got.attempt, "length", 1, 3)])):
            publisher.sink(step)
            assert step.flushed.wait(30)
    finally:
        publisher.stop()
    hints = []
    deadline = time.monotonic() + 5
    while len(hints) < 5 and time.monotonic() < deadline:
        msg = sub.get_message(timeout=0.5)
        if msg:
            hints.append(msg)
    sub.close()
    events = [f["e"] for _, f in r.xrange(channel)]
    assert events == ["queued", "started", "token", "token", "token", "done"]
    # one hint per script call: queued, started, two appends (2 tokens, 1 token), done
    assert len(hints) == 5 and {h["channel"] for h in hints} == {channel}


def run(port: int, scenario: Any, **hub_kwargs: Any) -> None:
    async def main() -> None:
        r = aioredis.Redis(port=port, db=13, decode_responses=True)
        await r.flushdb()
        hub = StreamHub(r, block_ms=200, notify=True, **hub_kwargs)
        await hub.start()
        try:
            await scenario(r, hub)
        finally:
            await hub.stop()
            await r.aclose()
    asyncio.run(main())


async def write(r: aioredis.Redis, key: str, fields: dict[str, str], *,
                announce: bool = True) -> None:
    """An entry as the job scripts write one: XADD, then a hint on the stream's channel."""
    await r.xadd(key, fields)  # type: ignore[arg-type]
    if announce:
        await r.publish(key, "")


def record_reads(r: aioredis.Redis, named: list[list[str]]) -> None:
    """From now on every XREAD on `r` appends the streams it names to `named`."""
    xread = r.xread

    async def spy(streams: dict[str, str], **kwargs: Any) -> Any:
        named.append(list(streams))
        return await xread(streams, **kwargs)  # type: ignore[arg-type]

    r.xread = spy  # type: ignore[method-assign,assignment]


def confirmations(hub: StreamHub, named: list[list[str]]) -> dict[str, int]:
    """From now on, each channel whose subscription the hub hears confirmed, with the
    number of reads made by then."""
    notifier = hub._notifier
    assert notifier is not None
    seen: dict[str, int] = {}
    on_hint = notifier._on_hint

    def spy(key: str, message: str) -> None:
        if not message:  # a confirmation (before any write: no plain hint yet)
            seen.setdefault(key, len(named))
        on_hint(key, message)

    notifier._on_hint = spy  # type: ignore[method-assign]
    return seen


async def settled(seen: dict[str, int], named: list[list[str]], streams: list[str]) -> None:
    """Until every stream's subscription is confirmed and a read after that has named it
    (the confirmation's read): from then on, only writes make reads."""
    deadline = time.monotonic() + 10
    while not all(k in seen and any(k in n for n in named[seen[k]:]) for k in streams):
        assert time.monotonic() < deadline, f"{len(seen)} of {len(streams)} confirmed"
        await asyncio.sleep(0.01)


async def collect(hub: StreamHub, key: str) -> list[str]:
    return [f["n"] async for _, f in hub.subscribe(key, None)]


def test_hints_carry_the_streams_and_idle_streams_cost_no_reads(
        redis_server: EmbeddedRedis) -> None:
    """With full reads a minute apart, every entry still arrives (hints alone), and once
    the subscriptions settle, a read names only the stream that moved, never the 50 idle
    ones (a blocking XREAD would name all 51 at each wake-up)."""
    named: list[list[str]] = []

    async def scenario(r: aioredis.Redis, hub: StreamHub) -> None:
        record_reads(r, named)
        seen = confirmations(hub, named)
        idle = [asyncio.create_task(collect(hub, f"idle{i}")) for i in range(50)]
        active = asyncio.create_task(collect(hub, "active"))
        # subscriptions confirmed (each a hint: a read naming its stream)
        await settled(seen, named, [f"idle{i}" for i in range(50)] + ["active"])
        settled_at = len(named)
        n = 100
        for i in range(n):
            await write(r, "active", {"e": "token", "n": str(i)})
            if i % 10 == 0:
                await asyncio.sleep(0.01)
        await write(r, "active", {"e": "done", "n": str(n)})
        assert await asyncio.wait_for(active, 10) == [str(i) for i in range(n + 1)]
        assert named[settled_at:] and all(keys_ == ["active"] for keys_ in named[settled_at:])
        for i in range(len(idle)):
            await write(r, f"idle{i}", {"e": "done", "n": "0"})
        assert await asyncio.wait_for(asyncio.gather(*idle), 10) == [["0"]] * 50
        assert hub.watched == 0

    run(redis_server.port, scenario, full_read_ms=SLOW_FULL_READ_MS)


def test_token_writes_carry_their_entries(redis_server: EmbeddedRedis) -> None:
    """The real append script announces the tokens it wrote with the id before them: the
    hub delivers them from the message, with no XREAD, exactly as the stream holds them
    (ids, fields, order). An entry written by anyone else in between breaks the chain: the
    next announcement is only a hint, one read fills the gap, and the chain resumes. A
    write of more than 64 tokens announces itself without them (a hint)."""
    job = "job_carried"
    events = keys.job_events(job)
    store = JobStore(redis.Redis(port=redis_server.port, db=13, decode_responses=True),
                     Settings(stream_maxlen=1000, result_ttl_s=60,
                              worker=WorkerSettings(lease_ttl_s=60, max_attempts=3)))
    named: list[list[str]] = []

    async def scenario(r: aioredis.Redis, hub: StreamHub) -> None:
        record_reads(r, named)
        seen = confirmations(hub, named)
        got = running_job(store, job)
        reader = asyncio.create_task(_entries(hub, events))
        await settled(seen, named, [events])  # subscribed; queued and started read
        reads_before = len(named)
        for step in range(10):
            if step == 5:
                await r.xadd(events, {"e": "note"})  # not announced by its writer
            store.write_step({(job, got.attempt): [
                TokenWrite(dumps({"text": f"t{i}", "index": i}), 100 + i, i)
                for i in (2 * step, 2 * step + 1)]}, [])
            await asyncio.sleep(0.02)
        store.write_step({(job, got.attempt): [  # 65: more than a message carries (64), a hint
            TokenWrite(dumps({"text": "x", "index": i}), 7, i) for i in range(20, 85)]}, [])
        await asyncio.sleep(0.02)
        store.write_step({}, [Ending(job, got.attempt, "succeeded", {}, "done", "{}", 85)])
        delivered = await asyncio.wait_for(reader, 10)
        assert delivered == await r.xrange(events)
        assert [f["e"] for _, f in delivered] == (
            ["queued", "started"] + ["token"] * 10 + ["note"] + ["token"] * 75 + ["done"])
        assert hub.carried == 18  # all tokens but the two after the unannounced entry
        # reads: that gap, the 65 tokens, the done hint
        assert named[reads_before:] == [[events]] * 3

    run(redis_server.port, scenario, full_read_ms=SLOW_FULL_READ_MS)


async def _entries(hub: StreamHub, key: str) -> list[tuple[str, dict[str, str]]]:
    return [entry async for entry in hub.subscribe(key, None)]


def test_a_writer_that_does_not_announce_is_read_by_the_full_read(
        redis_server: EmbeddedRedis) -> None:
    """A worker from before the hints (plain XADD): its entries arrive, at the pace of the
    full read, in order, once."""
    async def scenario(r: aioredis.Redis, hub: StreamHub) -> None:
        reader = asyncio.create_task(collect(hub, "quiet"))
        for i in range(5):
            await write(r, "quiet", {"e": "token", "n": str(i)}, announce=False)
            await asyncio.sleep(0.05)
        await write(r, "quiet", {"e": "done", "n": "5"}, announce=False)
        assert await asyncio.wait_for(reader, 10) == [str(i) for i in range(6)]

    run(redis_server.port, scenario, full_read_ms=200)


def test_a_killed_notification_connection_loses_nothing(redis_server: EmbeddedRedis) -> None:
    """Redis drops the pub/sub connection mid-stream (CLIENT KILL, as a failover or a
    network cut would): the notifier reconnects and subscribes again, the confirmation
    reads what was written meanwhile, and the stream goes on from hints, long before the
    next full read."""
    async def scenario(r: aioredis.Redis, hub: StreamHub) -> None:
        readers = [asyncio.create_task(collect(hub, f"k{i}")) for i in range(3)]
        await asyncio.sleep(0.3)
        for i in range(20):
            for k in range(3):
                await write(r, f"k{k}", {"e": "token", "n": str(i)})
            if i == 5:
                killed = await r.client_kill_filter(_type="pubsub")
                assert killed >= 1
            await asyncio.sleep(0.02)
        for k in range(3):
            await write(r, f"k{k}", {"e": "done", "n": "20"})
        t0 = time.monotonic()
        got = await asyncio.wait_for(asyncio.gather(*readers), 20)
        assert got == [[str(i) for i in range(21)]] * 3
        assert time.monotonic() - t0 < 10  # hints again, not the minute-long full read
        assert hub._notifier is not None and hub._notifier.reconnects >= 1

    run(redis_server.port, scenario, full_read_ms=SLOW_FULL_READ_MS)


@pytest.mark.parametrize("leave_early", [False, True])
def test_subscriptions_follow_the_watched_streams(redis_server: EmbeddedRedis,
                                                  leave_early: bool) -> None:
    """A channel is subscribed while its stream is watched and dropped after (Redis' own
    count), including a stream left before its subscription was even sent."""
    async def scenario(r: aioredis.Redis, hub: StreamHub) -> None:
        async def numsub() -> int:
            got: Any = await r.pubsub_numsub("w")
            return int(got[0][1])

        it = hub.subscribe("w", None)
        first = asyncio.create_task(it.__anext__())
        if leave_early:
            await asyncio.sleep(0)
        else:
            for _ in range(50):
                if await numsub() == 1:
                    break
                await asyncio.sleep(0.02)
            assert await numsub() == 1
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await it.aclose()
        assert hub.watched == 0
        for _ in range(50):
            if await numsub() == 0:
                break
            await asyncio.sleep(0.02)
        assert await numsub() == 0

    run(redis_server.port, scenario, full_read_ms=SLOW_FULL_READ_MS)


def test_a_redis_user_without_channel_rights_loses_nothing(
        r: redis.Redis, redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture) -> None:
    """An ACL user with every key but no channel (Redis 7's default for a new user): the
    scripts' PUBLISH is refused inside them (pcall), the job is still written whole, and the
    hub, refused its SUBSCRIBE, says why once and reads at the full-read interval."""
    user = "tokenq_nochannels"
    r.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "+@all", "resetchannels")
    try:
        limited = redis.Redis(port=redis_server.port, db=15, username=user, password="pw",
                              decode_responses=True)
        with pytest.raises(redis.exceptions.NoPermissionError):
            limited.publish("x", "")  # the user really lacks the channels
        store = JobStore(limited, Settings(stream_maxlen=1000, result_ttl_s=60))
        job = "job_nochannels"
        running_job(store, job)
        assert [f["e"] for _, f in r.xrange(keys.job_events(job))] == ["queued", "started"]
        assert r.zscore(keys.tenant_jobs("t"), job) is not None  # written after the PUBLISH
        limited.close()

        async def main() -> None:
            client = aioredis.Redis(port=redis_server.port, db=15, username=user,
                                    password="pw", decode_responses=True)
            hub = StreamHub(client, block_ms=200, notify=True, full_read_ms=200)
            await hub.start()
            try:
                reader = asyncio.create_task(collect(hub, "plain"))
                await asyncio.sleep(0.3)
                for i in range(3):
                    await client.xadd("plain", {"e": "token", "n": str(i)})
                await client.xadd("plain", {"e": "done", "n": "3"})
                assert await asyncio.wait_for(reader, 10) == ["0", "1", "2", "3"]
            finally:
                await hub.stop()
                await client.aclose()

        asyncio.run(main())
        refused = [m for m in caplog.messages if "Redis refused" in m]
        assert len(refused) == 1 and "&tokenq:job:*" in refused[0]
    finally:
        r.execute_command("ACL", "DELUSER", user)
