"""A waiting job's position and eta (shared/lua/eta.lua): at enqueue (create.lua) and on
demand (position.lua), checked against the order the lane's takes (pick.lua) really
follow, under fair share and FIFO."""

from __future__ import annotations

import json
import time

import pytest
import redis

from tests.unit.test_fair_share import SPEC, TICKET, Q, store, take
from tokenq.shared import jobs, keys
from tokenq.shared.eta import Estimate, estimate_sync
from tokenq.shared.jobs import Acquired, Created, Picked
from tokenq.shared.store import JobStore, fair_share


def submit(s: JobStore, tenant: str, *, weight: float = 1.0, est: int = 100,
           queue: str = Q) -> tuple[str, Created]:
    job_id = f"job_{tenant}-{s.r.incr(f'test:seq:{tenant}') - 1}"  # the API's id shape
    fields = {"id": job_id, "owner": tenant, "model": "m", "state": "queued",
              "attempts": "0", "created_at": repr(time.time()), "spec": SPEC,
              "request": "{}", "weight": repr(weight), "est_tokens": str(est),
              "prompt_tokens": "5"}
    got = s.create(job_id, fields, tenant=tenant, queue=queue, message=TICKET)
    assert isinstance(got, Created), got
    return job_id, got


def now_positions(s: JobStore, ids: list[str]) -> dict[str, int]:
    out = {}
    for j in ids:
        est = estimate_sync(s.r, j, fair_share(s.s))
        assert est is not None
        out[j] = est.position
    return out


@pytest.mark.parametrize("fair", [True, False])
def test_positions_at_enqueue_and_now_are_the_take_order(r: redis.Redis, fair: bool) -> None:
    s = store(r, fair=fair)
    # a heavy tenant with a backlog, light ones arriving among it, one of weight 2
    # (d's jobs are of another size: with weight 2 and the same size its service would tie
    # exactly with the others' at some takes, and a tie goes to whichever is charged first
    # then, which no estimate made now can know)
    plan = ["a"] * 12 + ["b", "a", "c", "b", "a", "c", "c", "b"] + ["d"] * 3
    at_enqueue = {}
    for t in plan:
        j, got = submit(s, t, weight=2.0 if t == "d" else 1.0, est=130 if t == "d" else 100)
        at_enqueue[j] = got.position
    ids = list(at_enqueue)
    now = now_positions(s, ids)
    order = take(s, len(ids))
    # now: exactly the jobs taken before each
    assert now == {j: i for i, j in enumerate(order)}
    # at enqueue: jobs created later can still go before it under fair share, never under FIFO
    if not fair:
        assert at_enqueue == {j: i for i, j in enumerate(order)}
    else:
        for j, pos in at_enqueue.items():
            before = {x for x in order[:order.index(j)] if ids.index(x) < ids.index(j)}
            assert pos == len(before), (j, pos, before)


def test_positions_shrink_as_jobs_are_taken(r: redis.Redis) -> None:
    s = store(r)
    ids = [submit(s, t)[0] for t in ["a", "a", "b", "a", "b"]]
    first = now_positions(s, ids)
    taken = take(s, 2)
    later = now_positions(s, [j for j in ids if j not in taken])
    assert all(later[j] == first[j] - 2 for j in later)
    assert estimate_sync(r, taken[0], fair_share(s.s)) is None  # not queued: no estimate


def test_higher_lanes_waiting_jobs_count(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", queue=keys.queue("m", "high"))
    submit(s, "b", queue=keys.queue("m", "high"))
    _, got = submit(s, "c", queue=keys.queue("m", "low"))
    assert got.position == 2
    _, got = submit(s, "c", queue=keys.queue("m", "high"))
    assert got.position == 2  # its lane only: the low one waits behind it


def take_at(s: JobStore, now: float) -> None:
    """One ticket's take (pick.lua) as a worker would make it at time `now`."""
    w = s.s.worker
    got = s._run(jobs.pick(Q, worker="w1", lease_ms=int(w.lease_ttl_s * 1000),
                           max_attempts=w.max_attempts, now=now, maxlen=s.s.stream_maxlen,
                           ttl=s.s.result_ttl_s, fair=fair_share(s.s)))
    assert isinstance(got, Picked) and isinstance(got.result, Acquired), got


def test_eta_is_position_times_the_pools_pace(r: redis.Redis) -> None:
    s = store(r)
    j, got = submit(s, "a")
    assert got.position == 0 and got.eta_s == 0  # an idle pool: it starts at once
    submit(s, "a")
    _, got = submit(s, "a")
    assert got.eta_s is None  # no pace measured yet
    t0 = time.time()  # two takes 0.2 s apart on the scripts' clock (no sleep)
    take_at(s, t0)  # work still waits: the next take's gap is the pool's pace
    take_at(s, t0 + 0.2)
    ids = [submit(s, "a")[0] for _ in range(3)]
    gaps = r.lrange(keys.lane(Q).rsplit(":", 1)[0] + ":gaps", 0, -1)
    assert len(gaps) == 1
    gap = float(gaps[0])
    assert 0.15 < gap < 1.0
    for i, j in enumerate(ids):
        est = estimate_sync(r, j, fair_share(s.s))
        assert est is not None and est.eta_s is not None
        assert est.eta_s == pytest.approx((est.position + 0.5) * gap, abs=0.002)
        assert est.position == i + 1


def test_the_first_in_line_of_an_idle_pool_is_not_told_it_starts_at_once_for_ever(
        r: redis.Redis) -> None:
    """The pool's last take left nothing waiting, so a job with nothing ahead was told 0
    (a free slot takes it): still 0 at every later look while every slot stayed busy.
    Once it has waited a second, the pool's pace says when a slot frees."""
    s = store(r)
    for _ in range(3):
        submit(s, "a")
    t0 = time.time()
    for i in range(3):  # the last take leaves nothing waiting: the pool looks idle
        take_at(s, t0 + 0.2 * i)
    gaps = [float(g) for g in r.lrange(keys.lane(Q).rsplit(":", 1)[0] + ":gaps", 0, -1)]
    assert len(gaps) == 2
    j, got = submit(s, "b")
    assert got.position == 0 and got.eta_s == 0
    now = time.time()
    est = estimate_sync(r, j, fair_share(s.s), now=now + 0.1)
    assert est is not None and est.eta_s == 0
    est = estimate_sync(r, j, fair_share(s.s), now=now + 5)
    assert est is not None and est.position == 0
    assert est.eta_s == pytest.approx(0.5 * sum(gaps) / len(gaps), abs=0.002)


def test_a_step_is_a_tenth_at_least_one() -> None:
    assert not Estimate(10, 5.0).moved(Estimate(10, 5.5))
    assert Estimate(9, 5.0).moved(Estimate(10, 5.0))
    assert not Estimate(95, 50.0).moved(Estimate(100, 52.0))
    assert Estimate(89, 50.0).moved(Estimate(100, 50.0))
    assert Estimate(10, 3.0).moved(Estimate(10, 5.0))
    assert Estimate(10, None).moved(Estimate(10, 5.0))


def test_the_client_and_cli_read_them() -> None:
    from tokenq.cli.client_cmds import queued_line
    from tokenq.client.models import Job, QueuedEvent, parse_event

    ev = parse_event(None, "queued", {"position": 12, "eta_s": 3.25, "reason": "waiting"})
    assert isinstance(ev, QueuedEvent) and (ev.position, ev.eta_s, ev.reason) == (
        12, 3.25, "waiting")
    assert queued_line(ev) == "queued (waiting): 12 jobs ahead, starts in 3.2 s"
    unknown = parse_event("1-0", "queued", {"position": 3, "reason": "loading"})
    assert isinstance(unknown, QueuedEvent)
    assert queued_line(unknown) == "queued (loading): 3 jobs ahead, starts in unknown"
    job = Job.model_validate({"id": "j", "status": "queued", "model": "m", "created_at": 1.0,
                              "position": 4, "eta_s": 1.5, "reason": "waiting"})
    assert (job.position, job.eta_s, job.reason) == (4, 1.5, "waiting")


def first_two(r: redis.Redis, s: JobStore, job: str,
              event: str) -> list[tuple[str | None, str, str]]:
    """What a client of `job` gets first from the SSE handler: the stream's one `queued`
    event (data `event`; the stream then stays open with nothing more), and the first
    update the handler sends between events (within 10 s)."""
    import asyncio
    from collections.abc import AsyncIterator
    from types import SimpleNamespace

    import redis.asyncio as aioredis

    from tokenq.api.queued_updates import with_updates

    async def stream() -> AsyncIterator[tuple[str, str, str]]:
        yield "1-0", "queued", event
        await asyncio.Event().wait()  # open, silent: until the handler is closed

    async def run() -> list[tuple[str | None, str, str]]:
        port = r.connection_pool.connection_kwargs["port"]
        state = SimpleNamespace(redis=aioredis.Redis(port=port, db=15), settings=s.s)
        got = []
        async for entry in with_updates(state, job, stream(), every_s=0.05):  # type: ignore[arg-type]
            got.append(entry)
            if len(got) == 2:
                break
        await state.redis.aclose()
        return got

    return asyncio.run(asyncio.wait_for(run(), 10))


def test_the_stream_resends_queued_with_the_waits_reason(r: redis.Redis) -> None:
    s = store(r)
    for _ in range(3):
        submit(s, "a")
    job, _ = submit(s, "a")
    got = first_two(r, s, job, '{"reason": "loading"}')  # the catalogue's: no position
    assert got[0] == ("1-0", "queued", '{"reason": "loading"}')
    assert got[1][0] is None and got[1][1] == "queued"
    assert json.loads(got[1][2]) == {"position": 3, "reason": "loading"}  # no pace yet


def test_a_job_that_arrives_while_its_model_loads_is_told_so_on_its_stream(
        r: redis.Redis) -> None:
    """Its own `queued` event (at create) says `waiting`; the model's catalogue entry says a
    worker is loading it: the stream's next update says `loading`."""
    from tokenq.shared.catalogue import CATALOGUE, CatalogueEntry
    from tokenq.shared.settings import ModelConfig

    s = store(r)
    submit(s, "a")
    job, _ = submit(s, "a")
    r.hset(CATALOGUE, "m", CatalogueEntry(name="m", spec=ModelConfig(backend="fake"),
                                          request={}, loading_since=time.time()
                                          ).model_dump_json())
    got = first_two(r, s, job, '{"position": 1, "reason": "waiting"}')
    assert got[1][0] is None and json.loads(got[1][2]) == {"position": 1, "reason": "loading"}


def test_get_says_loading_while_the_catalogue_loads_its_model(r: redis.Redis) -> None:
    import asyncio
    from types import SimpleNamespace

    import redis.asyncio as aioredis

    from tokenq.api.queued_updates import fill
    from tokenq.shared.catalogue import CATALOGUE, CatalogueEntry
    from tokenq.shared.schemas import JobRecord
    from tokenq.shared.settings import ModelConfig

    s = store(r)
    submit(s, "a")
    job, _ = submit(s, "a")

    def reason() -> tuple[str | None, int | None]:
        async def run() -> JobRecord:
            port = r.connection_pool.connection_kwargs["port"]
            state = SimpleNamespace(redis=aioredis.Redis(port=port, db=15), settings=s.s)
            rec = JobRecord.from_hash(r.hgetall(keys.job(job)))  # type: ignore[arg-type]
            try:
                return await fill(state, rec)  # type: ignore[arg-type]
            finally:
                await state.redis.aclose()
        rec = asyncio.run(run())
        return rec.reason, rec.position

    assert reason() == ("waiting", 1)
    entry = CatalogueEntry(name="m", spec=ModelConfig(backend="fake"), request={},
                           loading_since=time.time())
    r.hset(CATALOGUE, "m", entry.model_dump_json())
    assert reason() == ("loading", 1)
    r.hset(CATALOGUE, "m", entry.model_copy(update={"loading_since": None}).model_dump_json())
    assert reason() == ("waiting", 1)


def test_a_job_taken_between_the_two_reads_is_not_queued_without_a_reason(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /v1/jobs/{id} reads the record, then the job's estimate. A worker that takes
    the job in between made the answer `queued` with no position and no reason; the route
    now reads the record again."""
    import asyncio
    from types import SimpleNamespace

    import redis.asyncio as aioredis

    from tokenq.api import service
    from tokenq.api.routes.jobs import get_job
    from tokenq.shared.schemas import JobRecord

    s = store(r)
    job, _ = submit(s, "a")
    stale = JobRecord.from_hash(r.hgetall(keys.job(job)))  # type: ignore[arg-type]
    assert stale.status == "queued"
    take(s, 1)  # the worker's take, after the route's first read
    real, reads = service.get, []

    async def first_read_stale(state: object, tenant: str, job_id: str) -> JobRecord:
        reads.append(job_id)
        return stale if len(reads) == 1 else await real(state, tenant, job_id)  # type: ignore[arg-type]

    monkeypatch.setattr(service, "get", first_read_stale)

    async def run() -> JobRecord:
        port = r.connection_pool.connection_kwargs["port"]
        state = SimpleNamespace(redis=aioredis.Redis(port=port, db=15, decode_responses=True),
                                settings=s.s)
        try:
            return await get_job(job, state, "a")  # type: ignore[arg-type]
        finally:
            await state.redis.aclose()

    rec = asyncio.run(run())
    assert rec.status == "running" and rec.position is None, rec
