"""Fair share in Redis (shared/lua/pick.lua, fair.lua): which job a ticket takes."""

from __future__ import annotations

import threading
import time
from collections import Counter

import redis

from tokenq.shared import keys
from tokenq.shared.jobs import Acquired, Ending, NoJob, Picked, Skipped, SkipReason, dumps
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.shared.store import JobStore

Q = keys.queue("m", "normal")
SPEC = JobSpec(prompt="hi", params=SamplingParams(
    max_tokens=4, temperature=0, top_p=1, top_k=0, repetition_penalty=1)).model_dump_json()
TICKET = dumps({"properties": {"delivery_tag": "t"}})


def store(r: redis.Redis, fair: bool = True) -> JobStore:
    return JobStore(r, Settings(stream_maxlen=1000, result_ttl_s=60, fair_share=fair,
                                fair_share_window_s=3600,
                                worker=WorkerSettings(lease_ttl_s=60, max_attempts=3)))


def submit(s: JobStore, tenant: str, n: int, *, weight: float = 1.0, est: int = 100,
           deadline: float | None = None) -> list[str]:
    ids = []
    for _ in range(n):
        job_id = f"{tenant}-{s.r.incr(f'test:seq:{tenant}') - 1}"
        fields = {"id": job_id, "owner": tenant, "model": "m", "state": "queued",
                  "attempts": "0", "created_at": repr(time.time()), "spec": SPEC,
                  "request": "{}", "weight": repr(weight), "est_tokens": str(est),
                  "prompt_tokens": "5"}
        if deadline is not None:
            fields["deadline"] = repr(deadline)
        s.create(job_id, fields, tenant=tenant, queue=Q, message=TICKET)
        ids.append(job_id)
    return ids


def take(s: JobStore, n: int, worker: str = "w") -> list[str]:
    """The job ids of `n` tickets' takes (every take leases its job)."""
    out = []
    for _ in range(n):
        got = s.pick(Q, worker)
        assert isinstance(got, Picked) and isinstance(got.result, Acquired), got
        out.append(got.job_id)
    return out


def owner(job_id: str) -> str:
    return job_id.split("-")[0]


def test_the_least_served_tenant_goes_next_and_each_tenant_oldest_first(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 4)
    submit(s, "b", 2)
    got = take(s, 6)
    assert [owner(j) for j in got[:4]] == ["a", "b", "a", "b"]  # not a's backlog first
    assert [j for j in got if owner(j) == "a"] == ["a-0", "a-1", "a-2", "a-3"]
    assert isinstance(s.pick(Q, "w"), NoJob)  # all taken: a ticket left over finds nothing
    assert r.zcard(keys.lane_tenants(keys.lane(Q))) == 0


def test_fifo_setting_keeps_arrival_order(r: redis.Redis) -> None:
    s = store(r, fair=False)
    submit(s, "a", 4)
    submit(s, "b", 2)
    assert [owner(j) for j in take(s, 6)] == ["a", "a", "a", "a", "b", "b"]


def test_weights_divide_the_takes(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 60, weight=3)
    submit(s, "b", 60, weight=1)
    counts = Counter(owner(j) for j in take(s, 40))
    assert 29 <= counts["a"] <= 31 and counts["a"] + counts["b"] == 40, counts


def test_a_tenant_alone_gets_every_take(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 5)
    assert take(s, 3) == ["a-0", "a-1", "a-2"]  # however much it was served already
    submit(s, "b", 1)
    assert sorted(take(s, 2)) == ["a-3", "b-0"]  # b joins at a's level: one turn each
    assert take(s, 1) == ["a-4"]  # alone again


def test_a_tenant_that_comes_back_banks_little_credit(r: redis.Redis) -> None:
    """Idle while others were served, c enters one step (log2) below the lowest backlogged
    score, not at its own (near nothing): it goes first until it has caught up with half
    their service, then alternates with them instead of taking all its jobs first."""
    s = store(r)
    submit(s, "a", 20)
    submit(s, "b", 20)
    take(s, 20)  # a and b served 1,000 tokens each
    tenants = keys.lane_tenants(keys.lane(Q))
    scored: list[tuple[str, float]] = r.zrange(tenants, 0, -1, withscores=True)  # type: ignore[assignment]
    low = min(score for _, score in scored)
    submit(s, "c", 12)
    assert abs(float(r.zscore(tenants, "c") or 0) - (low - 1)) < 1e-6
    got = [owner(j) for j in take(s, 12)]
    assert got[:5] == ["c"] * 5, got  # 500 -> 1,000 tokens: caught up
    assert got[5:].count("c") <= 3, got  # then a, b and c in turn


def test_stale_ids_are_skipped_and_a_ticket_without_a_job_is_a_no_op(r: redis.Redis) -> None:
    s = store(r)
    a = submit(s, "a", 3)
    submit(s, "b", 1, deadline=time.time() - 1)  # past its deadline while waiting
    s.cancel(a[0])
    got = [s.pick(Q, "w") for _ in range(4)]
    taken = {g.job_id: g.result for g in got if isinstance(g, Picked)}
    assert taken.keys() == {"a-1", "a-2", "b-0"}  # a-0 (cancelled) skipped
    assert taken["b-0"] == Skipped(SkipReason.EXPIRED)
    assert isinstance(got[-1], NoJob)  # the cancelled job's ticket: acked, nothing taken
    assert r.hget(keys.job("a-0"), "state") == "cancelled"


def test_a_list_of_stale_ids_costs_one_bounded_step(r: redis.Redis) -> None:
    s = store(r)
    for j in submit(s, "a", 70):
        s.cancel(j)
    submit(s, "b", 1)
    first = s.pick(Q, "w")
    assert first == NoJob("stale")  # 64 skipped, not the whole list in one script
    assert take(s, 1) == ["b-0"]  # a's remaining stale ids skipped on the way


def test_concurrent_takers_take_each_job_exactly_once(r: redis.Redis) -> None:
    s = store(r)
    ids = [j for t in "abcde" for j in submit(s, t, 40)]
    taken: list[str] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        mine = JobStore(redis.Redis(connection_pool=r.connection_pool), s.s)
        while isinstance(got := mine.pick(Q, name), Picked):
            with lock:
                taken.append(got.job_id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(taken) == sorted(ids)  # none twice, none lost
    assert all(r.hget(keys.job(j), "state") == "running" for j in ids)


def test_the_finish_corrects_the_charge_to_what_ran(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "a", 1, est=105)  # prompt 5 + max_tokens 100
    [job_id] = take(s, 1)
    assert float(r.hget(keys.share("a"), "served") or 0) > 104.9
    r.hset(keys.job(job_id), "n_tokens", 10)
    assert s.finish(Ending(job_id, 1, "succeeded", {"finished_at": repr(time.time())},
                           "done", "{}"))
    assert abs(float(r.hget(keys.share("a"), "served") or 0) - 15) < 0.01  # 5 + 10
    assert r.hget(keys.job(job_id), "charged") is None
