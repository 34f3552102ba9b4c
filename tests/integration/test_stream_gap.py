"""A Redis failover that loses the tail of a job's stream, simulated on one real Redis: the
real publisher notices on its next write (append answers where the stream really ends)
and re-sends the lost tokens from its own record, so the stream read from 0 has every
token once, in order, and the terminal record's output is the concatenated stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from tokenq.shared import keys
from tokenq.shared.jobs import Acquired, dumps
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Finished, StepOutput, TokenDelta
from tokenq.workers.publisher import JobHandle, Publisher

JOB = "job_gap"
EVENTS = keys.job_events(JOB)
SETTINGS = Settings(stream_maxlen=10_000, result_ttl_s=60,
                    worker=WorkerSettings(lease_ttl_s=60, max_attempts=3))
SPEC = JobSpec(prompt="hi", params=SamplingParams(
    max_tokens=64, temperature=0, top_p=1, top_k=0, repetition_penalty=1)).model_dump_json()
N, LOST = 30, 7  # tokens streamed before the failover, and how many of them it loses


@pytest.fixture
def pub(r: redis.Redis) -> Iterator[tuple[Publisher, JobHandle]]:
    store = JobStore(r, SETTINGS)
    fields = {"id": JOB, "owner": "t", "model": "m", "state": "queued", "attempts": "0",
              "created_at": repr(time.time()), "spec": SPEC, "request": "{}"}
    store.create(JOB, fields, tenant="t", queue="q",
                 message=dumps({"properties": {"delivery_tag": "tag1"}}))
    got = store.acquire(JOB, "w1")
    assert isinstance(got, Acquired) and got.attempt == 1
    publisher = Publisher(store)
    handle = publisher.track(JOB, 1)
    publisher.start()
    yield publisher, handle
    publisher.stop()


def text(i: int) -> str:
    return f"t{i} "


def stream(publisher: Publisher, first: int, last: int, *, finish: bool = False) -> None:
    """Tokens first..last-1 in steps of 3 (then the job's end), each step waited into Redis."""
    for lo in range(first, last, 3):
        toks = [TokenDelta(JOB, 1, i, text(i), 1000 + i) for i in range(lo, min(lo + 3, last))]
        step = StepOutput(toks, [Finished(JOB, 1, "length", 2, last)]
                          if finish and lo + 3 >= last else [])
        publisher.sink(step)
        assert step.flushed.wait(30)
    if finish and first >= last:
        step = StepOutput([], [Finished(JOB, 1, "length", 2, last)])
        publisher.sink(step)
        assert step.flushed.wait(30)


def entries(r: redis.Redis, after: str = "-") -> list[tuple[str, dict[str, str]]]:
    got: list[tuple[str, dict[str, str]]] = r.xrange(EVENTS, min=after)  # type: ignore[assignment]
    return got


def tokens(got: list[tuple[str, dict[str, str]]]) -> list[tuple[str, int, str]]:
    return [(eid, json.loads(f["d"])["index"], json.loads(f["d"])["text"])
            for eid, f in got if f["e"] == "token"]


def lose_tail(r: redis.Redis, lost: int, *, keep_ids: bool) -> None:
    """What a promoted replica holds when the last `lost` token events never reached it:
    the stream without them and `n_tokens` to match (one script wrote both). keep_ids: the
    stream rebuilt as the replica has it (its top is the last entry it got); else XDEL,
    which leaves the stream's last-generated id past the lost entries."""
    kept = entries(r)[:-lost]
    n = sum(1 for _, f in kept if f["e"] == "token")
    if keep_ids:
        pipe = r.pipeline(transaction=True)
        pipe.delete(EVENTS)
        for eid, f in kept:
            pipe.xadd(EVENTS, f, id=eid)  # type: ignore[arg-type]
        pipe.hset(keys.job(JOB), "n_tokens", n)
        pipe.execute()
    else:
        r.xdel(EVENTS, *[eid for eid, _ in entries(r)[-lost:]])
        r.hset(keys.job(JOB), "n_tokens", n)


def assert_contiguous_and_final(r: redis.Redis, n: int) -> None:
    got = entries(r)
    toks = tokens(got)
    assert [i for _, i, _ in toks] == list(range(n))
    assert [t for _, _, t in toks] == [text(i) for i in range(n)]
    kinds = [f["e"] for _, f in got]
    assert kinds[0] == "queued" and kinds[1] == "started" and kinds[-1] == "done"
    assert kinds.count("done") == 1 and len(kinds) == n + 3
    assert r.hget(keys.job(JOB), "state") == "succeeded"
    assert r.hget(keys.job(JOB), "output") == "".join(t for _, _, t in toks)
    assert r.hget(keys.job(JOB), "n_tokens") == str(n)


def test_lost_tail_resent_with_its_ids(r: redis.Redis, pub: tuple[Publisher, JobHandle]) -> None:
    """A replica-shaped loss: the re-sent tokens keep the entry ids they had, so a client
    that saw them and resumes with Last-Event-ID gets the rest and nothing twice."""
    publisher, handle = pub
    stream(publisher, 0, N)
    before = tokens(entries(r))
    seen = before[-1][0]  # a client read every token from the old primary
    lose_tail(r, LOST, keep_ids=True)
    assert len(tokens(entries(r))) == N - LOST
    stream(publisher, N, N + 5, finish=True)
    assert_contiguous_and_final(r, N + 5)
    assert tokens(entries(r))[:N] == before  # same ids, same order
    resumed = tokens(entries(r, "(" + seen))
    assert [i for _, i, _ in resumed] == list(range(N, N + 5))
    # the lost tokens, and the 3 of the next step that the stream could not take after a gap
    assert handle.resent == LOST + 3 and handle.outcome == "succeeded"


def test_lost_tail_after_xdel_resent_with_new_ids(r: redis.Redis,
                                                  pub: tuple[Publisher, JobHandle]) -> None:
    """XDEL leaves the stream's top id past the lost entries: their ids cannot be reused,
    the tokens are re-sent with new ones, still contiguous and equal to the record."""
    publisher, handle = pub
    stream(publisher, 0, N)
    lose_tail(r, LOST, keep_ids=False)
    stream(publisher, N, N + 4, finish=True)
    assert_contiguous_and_final(r, N + 4)
    assert handle.resent == LOST + 3


def test_finish_waits_for_the_lost_tail(r: redis.Redis,
                                        pub: tuple[Publisher, JobHandle]) -> None:
    """The loss noticed only by the job's ending (no token left to write): finish answers
    that the stream is short, the tail is re-sent, then the job ends."""
    publisher, handle = pub
    stream(publisher, 0, N)
    lose_tail(r, LOST, keep_ids=True)
    stream(publisher, N, N, finish=True)
    assert handle.done.wait(30)
    assert_contiguous_and_final(r, N)
    assert handle.resent == LOST and handle.outcome == "succeeded"


def test_resume_point_keeps_a_cursor_a_failover_lost(r: redis.Redis) -> None:
    """A Last-Event-ID past a running stream's end: kept when it is no later than Redis'
    clock (an id the client read before a failover lost it, re-sent with that id), read
    as the end when it is from the future; past a terminal event: nothing follows."""
    import asyncio

    import redis.asyncio as aioredis

    from tokenq.api.stream_ids import resume_point

    top = str(r.xadd(EVENTS, {"e": "token", "d": "{}"}))
    ms = int(top.split("-")[0])
    lost = f"{ms}-{int(top.split('-')[1]) + 5}"  # later than the stream's top, not future
    future = f"{ms + 3_600_000}-0"

    async def points() -> list[str | None]:
        a = aioredis.Redis(connection_pool=aioredis.ConnectionPool(
            **r.connection_pool.connection_kwargs))
        try:
            got = [await resume_point(a, EVENTS, c) for c in (lost, future)]
            await a.xadd(EVENTS, {"e": "done", "d": "{}"})
            got.append(await resume_point(a, EVENTS, future))
            return got
        finally:
            await a.aclose()

    assert asyncio.run(points()) == [lost, top, None]
