"""The job state machine's Lua scripts on a real Redis: lease, fencing, one terminal state."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from shared import keys
from shared.jobs import (
    ACQUIRE,
    APPEND,
    CANCEL,
    CREATE,
    FINISH,
    RENEW,
    RENEW_JOB,
    REQUEUE,
    dumps,
)

JOB = "job_t1"
K3 = [keys.job(JOB), keys.job_events(JOB), keys.job_lease(JOB)]
K4 = [*K3, keys.RUNNING]
MSG = dumps({"properties": {"delivery_tag": "tag1"}})
MSG2 = dumps({"properties": {"delivery_tag": "tag2"}})


def create(r: redis.Redis, limit: int = 0, deadline: float | None = None,
           tenant_limit: int = 0) -> list[Any]:
    fields = {"id": JOB, "owner": "t", "model": "m", "state": "queued", "attempts": "0",
              "created_at": repr(time.time()), "spec": "{}", "request": "{}"}
    if deadline is not None:
        fields["deadline"] = repr(deadline)
    out: list[Any] = r.eval(CREATE, 6, keys.job(JOB), keys.job_events(JOB), "q", "tenant",
                            "tq", keys.QUEUED, dumps(fields), MSG, limit, 1000, 1, tenant_limit)
    return out


def acquire(r: redis.Redis, worker: str = "w1", max_attempts: int = 3) -> list[Any]:
    out: list[Any] = r.eval(ACQUIRE, 4, *K4, worker, 60000, max_attempts, repr(time.time()),
                            1000, 60)
    return out


def finish(r: redis.Redis, attempt: int, state: str = "succeeded", event: str = "done") -> int:
    return int(r.eval(FINISH, 4, *K4, attempt, state, dumps({"output": "x"}), event, "{}",
                      1000, 60))


def events(r: redis.Redis) -> list[str]:
    return [f["e"] for _, f in r.xrange(keys.job_events(JOB))]


def test_create_writes_record_message_and_queued_event(r: redis.Redis) -> None:
    assert create(r) == [1, 0]
    assert r.hget(keys.job(JOB), "state") == "queued"
    assert r.lrange("q", 0, -1) == [MSG]
    assert events(r) == ["queued"]
    assert json.loads(r.xrange(keys.job_events(JOB))[0][1]["d"]) == {"position": 0}


def test_create_refuses_when_queue_full(r: redis.Redis) -> None:
    r.lpush("q", "a", "b")
    assert create(r, limit=2) == [-1, 2]
    assert not r.exists(keys.job(JOB)) and r.llen("q") == 2


def test_tenant_queued_limit_counts_only_queued_jobs(r: redis.Redis) -> None:
    r.zadd("tq", {"other": 1})
    assert create(r, tenant_limit=1) == [-2, 1]
    r.delete("tq")
    assert create(r, tenant_limit=1) == [1, 0]
    assert r.zcard("tq") == 1
    acquire(r)  # running jobs no longer count against the tenant's queued limit
    assert r.zcard("tq") == 0


def test_replayed_token_step_is_written_once(r: redis.Redis) -> None:
    create(r)
    acquire(r)
    step = [dumps({"text": "a", "index": 0}), 1, 0, dumps({"text": "b", "index": 1}), 2, 1]
    assert r.eval(APPEND, 3, *K3, 1, 1000, *step) == 1
    assert r.eval(APPEND, 3, *K3, 1, 1000, *step) == 1  # a retry after a cut pipeline
    assert r.eval(APPEND, 3, *K3, 1, 1000, dumps({"text": "d", "index": 3}), 4, 3) == 1  # gap
    assert events(r) == ["queued", "started", "token", "token"]


def test_duplicate_delivery_with_live_lease_drops_itself(r: redis.Redis) -> None:
    create(r)
    assert acquire(r, "w1")[:2] == ["ok", 1]
    assert acquire(r, "w2") == ["busy"]
    assert r.hget(keys.job(JOB), "attempts") == "1"
    assert events(r) == ["queued", "started"]


def test_stale_attempt_is_fenced_off(r: redis.Redis) -> None:
    create(r)
    acquire(r, "w1")
    r.delete(keys.job_lease(JOB))  # w1's lease expired (it froze)
    assert acquire(r, "w2")[:2] == ["ok", 2]
    assert r.eval(APPEND, 3, *K3, 1, 1000, dumps({"text": "old", "index": 0}), 5, 0) == 0
    assert r.eval(APPEND, 3, *K3, 2, 1000, dumps({"text": "new", "index": 0}), 5, 0) == 1
    assert finish(r, 1) == 0
    assert finish(r, 2) == 1
    assert finish(r, 2) == 0  # exactly one terminal write
    assert events(r) == ["queued", "started", "started", "token", "done"]
    assert r.ttl(keys.job(JOB)) > 0 and r.ttl(keys.job_events(JOB)) > 0
    assert acquire(r, "w3") == ["terminal"]


def test_attempts_are_bounded(r: redis.Redis) -> None:
    create(r)
    for n in (1, 2, 3):
        assert acquire(r, f"w{n}", max_attempts=3)[:2] == ["ok", n]
        r.delete(keys.job_lease(JOB))  # the worker died
    assert acquire(r, "w4", max_attempts=3) == ["exhausted"]
    h = r.hgetall(keys.job(JOB))
    assert h["state"] == "failed" and json.loads(h["error"])["code"] == "max_attempts"
    assert events(r)[-1] == "error"


def test_deadline_passed_in_queue_expires(r: redis.Redis) -> None:
    create(r, deadline=time.time() - 1)
    assert acquire(r) == ["expired"]
    assert r.hget(keys.job(JOB), "state") == "expired"


def test_cancel_queued_then_running(r: redis.Redis) -> None:
    create(r)
    assert r.eval(CANCEL, 2, keys.job(JOB), keys.job_events(JOB), 1, 1000, 60) == "cancelled"
    assert acquire(r) == ["terminal"]
    assert events(r) == ["queued", "cancelled"]
    r.flushdb()
    create(r)
    acquire(r)
    assert r.eval(CANCEL, 2, keys.job(JOB), keys.job_events(JOB), 1, 1000, 60) == "running"
    assert r.hget(keys.job(JOB), "cancel_requested") == "1"
    # The worker's next token write still lands, and answers 2: "stop this job now".
    step = [dumps({"text": "a", "index": 0}), 1, 0]
    assert r.eval(APPEND, 3, *K3, 1, 1000, *step) == 2
    assert events(r)[-1] == "token"


def test_renew_only_own_lease(r: redis.Redis) -> None:
    create(r)
    acquire(r, "w1")
    assert r.eval(RENEW, 1, keys.job_lease(JOB), "w1|1", 90000) == 1
    assert r.pttl(keys.job_lease(JOB)) > 60000
    assert r.eval(RENEW, 1, keys.job_lease(JOB), "w2|1", 90000) == 0


def renew_job(r: redis.Redis, worker: str, attempt: int) -> int:
    return int(r.eval(RENEW_JOB, 2, keys.job_lease(JOB), keys.job(JOB), f"{worker}|{attempt}",
                      90000, attempt))


def test_job_lease_expired_during_a_stall_is_taken_back_only_while_still_ours(
        r: redis.Redis) -> None:
    """A worker frozen past its lease (GC pause, stalled VM) keeps its job if no takeover
    happened meanwhile; once a newer attempt took it, or it ended, the lease stays lost."""
    create(r)
    r.delete("q")
    acquire(r, "w1")
    assert renew_job(r, "w1", 1) == 1 and r.pttl(keys.job_lease(JOB)) > 60000
    assert renew_job(r, "w2", 1) == 0  # not w2's
    r.delete(keys.job_lease(JOB))  # expired while w1 was stalled
    assert renew_job(r, "w1", 1) == 1
    assert r.get(keys.job_lease(JOB)) == "w1|1"
    assert requeue(r) == 0  # the reconcile that runs next finds a live lease
    r.delete(keys.job_lease(JOB))  # stalled again, and this time ...
    assert requeue(r) == 1  # ... a reconciler re-enqueued it
    assert renew_job(r, "w1", 1) == 1  # before the copy was taken: w1 keeps it
    assert acquire(r, "w2")[0] == "busy"  # the copy drops itself
    r.delete(keys.job_lease(JOB))
    assert acquire(r, "w2")[:2] == ["ok", 2]  # a takeover happened
    r.delete(keys.job_lease(JOB))
    assert renew_job(r, "w1", 1) == 0  # the old attempt cannot take it back
    assert finish(r, 2) == 1
    assert renew_job(r, "w2", 2) == 0  # ended: nothing to renew
    assert not r.exists(keys.job_lease(JOB))


def requeue(r: redis.Redis) -> int:
    return int(r.eval(REQUEUE, 6, keys.job(JOB), keys.job_lease(JOB), keys.RUNNING, "q",
                      keys.KOMBU_UNACKED, keys.QUEUED, MSG2))


def test_queued_job_whose_message_was_lost_is_rescued_once(r: redis.Redis) -> None:
    create(r)
    assert r.zrange(keys.QUEUED, 0, -1) == [keys.job(JOB)]
    assert requeue(r) == 0  # its message is still in the queue
    r.delete("q")  # popped by a worker that died before kombu recorded it as unacked
    assert requeue(r) == 1 and r.lrange("q", 0, -1) == [MSG2]
    assert requeue(r) == 0
    acquire(r)
    assert r.zrange(keys.QUEUED, 0, -1) == []


def test_running_index_and_requeue_after_lease_expiry(r: redis.Redis) -> None:
    create(r)
    r.delete("q")
    acquire(r, "w1")
    assert r.zrange(keys.RUNNING, 0, -1) == [keys.job(JOB)]
    assert requeue(r) == 0  # live lease: nothing to do
    r.delete(keys.job_lease(JOB))  # the worker died
    assert requeue(r) == 1 and r.lrange("q", 0, -1) == [MSG2]
    assert requeue(r) == 0  # exactly once, however many workers reconcile
    r.delete("q")
    r.hset(keys.KOMBU_UNACKED, "tag2", "x")  # a worker took the message, not yet ACQUIREd
    assert requeue(r) == 0
    r.delete(keys.KOMBU_UNACKED)  # ... and died before recording it: the message is gone
    assert requeue(r) == 1 and r.lrange("q", 0, -1) == [MSG2]
    assert acquire(r, "w2")[:2] == ["ok", 2]  # the takeover
    assert r.zrange(keys.RUNNING, 0, -1) == [keys.job(JOB)]
    assert finish(r, 2) == 1
    assert r.zrange(keys.RUNNING, 0, -1) == []


def test_publisher_tells_the_engine_of_a_cancel_within_one_step(r: redis.Redis) -> None:
    """A cancel requested while the job streams reaches the engine on the next token
    write (no poll interval), once, however many steps are still in flight."""
    from shared.settings import Settings
    from workers.engines.base import StepOutput, TokenDelta
    from workers.publisher import Publisher

    create(r)
    acquire(r)
    told: list[str] = []
    pub = Publisher(r, Settings(), on_cancel=told.append)
    pub.start()
    try:
        pub.track(JOB, 1)
        pub.sink(StepOutput([TokenDelta(JOB, 1, 0, "a", 1)], []))
        r.eval(CANCEL, 2, keys.job(JOB), keys.job_events(JOB), 1, 1000, 60)
        for i in (1, 2):
            pub.sink(StepOutput([TokenDelta(JOB, 1, i, "b", 2)], []))
        deadline = time.monotonic() + 5
        while r.hget(keys.job(JOB), "n_tokens") != "3":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        pub.stop()
    assert told == [JOB]


def test_publisher_flushes_a_step_only_once_it_is_in_redis(r: redis.Redis) -> None:
    """StepOutput.flushed (what the engine waits on after a first token) is set after the
    step's events are in the job's stream, for coalesced steps too."""
    from shared.settings import Settings
    from workers.engines.base import StepOutput, TokenDelta
    from workers.publisher import Publisher

    create(r)
    acquire(r)
    pub = Publisher(r, Settings())
    steps = [StepOutput([TokenDelta(JOB, 1, i, "t", 1)], [], first_token=i == 0)
             for i in range(3)]
    pub.track(JOB, 1)
    for st in steps:  # queued before the thread starts: written as one coalesced step
        pub.sink(st)
    assert not any(st.flushed.is_set() for st in steps)
    pub.start()
    try:
        for st in steps:
            assert st.flushed.wait(5)
        assert r.hget(keys.job(JOB), "n_tokens") == "3"
    finally:
        pub.stop()
