"""Moving a queued job between a model's pools in Redis (shared/lua/move.lua): the lane's
next job goes, with its ticket and its count in the pools' loads; pinned, running,
handed-back and changed jobs stay."""

from __future__ import annotations

import time

import redis

from tests.unit.test_fair_share import SPEC, store
from tokenq.shared import keys
from tokenq.shared.celery_app import create_celery, task_message, ticket_message
from tokenq.shared.jobs import Acquired, Picked
from tokenq.shared.moves import Moved, MoveResult
from tokenq.shared.schemas import Pace
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore
from tokenq.workers.rebalance import Head, worth_moving

A, B = "m@a", "m@b"
QA, QB = keys.queue(A, "normal"), keys.queue(B, "normal")
CELERY = create_celery(Settings(redis_url="redis://127.0.0.1:1/0"))  # (never connects)


def submit(s: JobStore, tenant: str, n: int, **extra: str) -> list[str]:
    ids = []
    for _ in range(n):
        job_id = f"{tenant}-{s.r.incr(f'test:seq:{tenant}') - 1}"
        fields = {"id": job_id, "owner": tenant, "model": "m", "pool": A, "state": "queued",
                  "attempts": "0", "created_at": repr(time.time()), "spec": SPEC,
                  "request": "{}", "est_tokens": "100", "prompt_tokens": "5", **extra}
        s.create(job_id, fields, tenant=tenant, queue=QA, message=ticket_message(CELERY, QA))
        s.r.hincrby(keys.POOL_LOAD, A, 1)  # as placement counts it
        ids.append(job_id)
    return ids


def move(s: JobStore, expected: str) -> MoveResult:
    return s.move(expected, from_queue=QA, to_queue=QB, from_pool=A, to_pool=B,
                  to_backend="vllm", ticket=ticket_message(CELERY, QB))


def test_the_next_job_moves_with_its_ticket_and_its_load(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "x", 3)
    assert move(s, "x-0") == MoveResult(Moved.OK, "x-0")
    la, lb = keys.lane(QA), keys.lane(QB)
    assert r.lrange(keys.lane_list(la, "x"), 0, -1) == ["x-1", "x-2"]
    assert r.lrange(keys.lane_list(lb, "x"), 0, -1) == ["x-0"]
    assert r.zrange(keys.lane_tenants(lb), 0, -1) == ["x"]
    rec = r.hgetall(keys.job("x-0"))
    assert (rec["lane"], rec["pool"], rec["moved_from"], rec["state"]) == (lb, B, A, "queued")
    assert rec["backend"] == "vllm"  # where it runs now
    assert (r.llen(QA), r.llen(QB)) == (2, 1)  # each queue's length is still its backlog
    assert r.hgetall(keys.POOL_LOAD) == {A: "2", B: "1"}
    # the other pool's ticket takes it, as any ticket of its own lane
    got = s.pick(QB, "worker-b")
    assert isinstance(got, Picked) and got.job_id == "x-0"
    assert isinstance(got.result, Acquired)


def test_only_the_job_the_caller_estimated_moves(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "x", 2)
    assert move(s, "x-1") == MoveResult(Moved.CHANGED, "x-0")
    assert move(s, "") == MoveResult(Moved.CHANGED, "x-0")
    assert r.llen(QA) == 2 and r.llen(QB) == 0 and r.hgetall(keys.POOL_LOAD) == {A: "2"}


def test_the_fairest_tenants_job_is_the_one_that_moves(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "x", 3)
    submit(s, "y", 1)
    tenants = keys.lane_tenants(keys.lane(QA))
    r.zadd(tenants, {"x": float(r.zscore(tenants, "y") or 0) + 10})  # x served far more
    assert move(s, "y-0") == MoveResult(Moved.OK, "y-0")
    assert r.zrange(keys.lane_tenants(keys.lane(QA)), 0, -1) == ["x"]  # y's list is empty


def test_pinned_handed_back_and_ended_jobs_stay(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "p", 1, pinned="1")
    assert move(s, "p-0") == MoveResult(Moved.PINNED, "p-0")
    r.delete(keys.lane_list(keys.lane(QA), "p"))
    r.zrem(keys.lane_tenants(keys.lane(QA)), "p")
    submit(s, "h", 1)
    r.hset(keys.job("h-0"), "msg", task_message(CELERY, "h-0", QA))  # a message names it
    assert move(s, "h-0") == MoveResult(Moved.PINNED, "h-0")
    r.hdel(keys.job("h-0"), "msg")
    r.hset(keys.job("h-0"), "state", "cancelled")
    assert move(s, "h-0") == MoveResult(Moved.STALE, "h-0")
    assert r.llen(QB) == 0 and "moved_from" not in r.hgetall(keys.job("h-0"))
    r.delete(keys.lane_list(keys.lane(QA), "h"))
    r.zrem(keys.lane_tenants(keys.lane(QA)), "h")
    assert move(s, "h-0") == MoveResult(Moved.EMPTY)


def test_a_message_that_names_its_job_is_not_taken_for_a_ticket(r: redis.Redis) -> None:
    s = store(r)
    submit(s, "x", 1)
    bound = task_message(CELERY, "other", QA)
    r.rpush(QA, bound)  # at the consuming end, after the ticket
    assert move(s, "x-0").status is Moved.OK
    assert r.lrange(QA, 0, -1) == [bound]  # the ticket went, the bound message stayed


def test_the_rule_moves_a_job_only_where_it_finishes_sooner() -> None:
    def pace(tps: float) -> Pace:  # a 40-token job takes 40 / tps seconds
        return Pace(jobs=5, job_s=40 / tps, first_token_s=0.0, decode_tps=tps,
                    prompt_tps=1e9)

    job = Head("j", n_prompt=1, max_tokens=41)
    # nobody serves the other pool: always
    assert worth_moving(job, pace(20), None, 0, 5)[0]
    # the other pool has a free slot (load within its slots): it takes the job itself
    assert not worth_moving(job, pace(100), pace(20), 4, 4)[0]
    # busy, and this pool 5x faster: 0.4 s here against 1 s (a slot freeing) + 2 s there
    ok, here, there = worth_moving(job, pace(100), pace(20), 1, 3)
    assert ok and round(here, 2) == 0.4 and round(there, 2) == 3.0
    # busy, but this pool 10x slower: 4 s here against 0.2 + 0.4 s there
    assert not worth_moving(job, pace(10), pace(100), 1, 3)[0]
