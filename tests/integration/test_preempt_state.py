"""preempt.lua on a real Redis through the job store: a preempted job is `queued` again
with its tokens kept, resumes as a takeover does, and preemptions do not use up
max_attempts. The victim choice (workers/preempt.pick_victims) is checked here too."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import redis

from tests.integration.test_job_state import (
    JOB,
    MSG2,
    acquire,
    append,
    attempt_of,
    create,
    events,
    finish,
    renew_job,
    store,
)
from tokenq.shared import keys
from tokenq.shared.celery_app import create_celery, task_message
from tokenq.shared.jobs import Appended, Skipped, SkipReason
from tokenq.shared.settings import Settings
from tokenq.workers.preempt import Preemptor, Running, pick_victims


def preempt(r: redis.Redis, worker: str, attempt: int) -> bool:
    return store(r).preempt(JOB, worker, attempt, "q", MSG2)


def test_preempted_job_is_queued_again_with_its_tokens_and_resumes(r: redis.Redis) -> None:
    create(r)
    r.delete("q")
    assert attempt_of(acquire(r, "w1")) == 1
    assert append(r, 1, ("a", 5, 0), ("b", 6, 1)) is Appended.WRITTEN
    assert preempt(r, "w2", 1) is False  # not w2's lease
    assert preempt(r, "w1", 1) is True
    h = r.hgetall(keys.job(JOB))
    assert h["state"] == "queued" and h["preemptions"] == "1" and h["msg"] == MSG2
    assert not r.exists(keys.job_lease(JOB))
    assert r.zscore(keys.RUNNING, keys.job(JOB)) is None
    assert r.zscore(keys.QUEUED, keys.job(JOB)) is not None  # a lost message is rescued
    assert r.lrange("q", 0, -1) == [MSG2]
    assert preempt(r, "w1", 1) is False  # once
    assert append(r, 1, ("x", 7, 2)) is Appended.FENCED  # a step in flight is fenced off
    assert finish(r, 1) is False
    assert attempt_of(acquire(r, "w2")) == 2
    assert append(r, 2, ("c", 8, 2)) is Appended.WRITTEN
    assert finish(r, 2) is True
    assert events(r) == ["queued", "started", "token", "token", "queued", "started", "token",
                         "done"]
    entries: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
        keys.job_events(JOB))
    toks = [json.loads(f["d"]) for _, f in entries if f["e"] == "token"]
    assert [t["index"] for t in toks] == [0, 1, 2]
    requeued = [json.loads(f["d"]) for _, f in entries if f["e"] == "queued"]
    assert requeued[1] == {"position": None}


def test_preemptions_do_not_use_up_max_attempts(r: redis.Redis) -> None:
    create(r)
    for n in (1, 2, 3, 4):  # four attempts preempted: max_attempts is 2
        assert attempt_of(acquire(r, "w1", max_attempts=2)) == n
        assert preempt(r, "w1", n) is True
    assert attempt_of(acquire(r, "w1", max_attempts=2)) == 5
    r.delete(keys.job_lease(JOB))  # the worker died: one lost attempt
    assert attempt_of(acquire(r, "w2", max_attempts=2)) == 6
    r.delete(keys.job_lease(JOB))  # and again: two lost, the bound
    assert acquire(r, "w3", max_attempts=2) == Skipped(SkipReason.EXHAUSTED)
    err = json.loads(r.hget(keys.job(JOB), "error") or "{}")
    assert err["code"] == "max_attempts" and "2 times" in err["message"]


def test_a_running_job_that_ended_is_not_preempted(r: redis.Redis) -> None:
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    assert finish(r, 1) is True
    r.set(keys.job_lease(JOB), "w1|1")  # even with a lease left behind
    assert preempt(r, "w1", 1) is False
    assert r.hget(keys.job(JOB), "state") == "succeeded"


def run(job_id: str, priority: str, preemptions: int = 0) -> Running:
    return Running(job_id, priority, preemptions)


def test_victims_are_the_lowest_lane_most_recent_below_the_waiting_lane() -> None:
    running = [run("l1", "low"), run("n1", "normal"), run("l2", "low"), run("h1", "high")]
    assert pick_victims(running, {"high": 1}, 2) == ["l2"]
    assert pick_victims(running, {"high": 3}, 2) == ["l2", "l1", "n1"]
    assert pick_victims(running, {"high": 9}, 2) == ["l2", "l1", "n1"]  # never a high one
    assert pick_victims(running, {"normal": 3}, 2) == ["l2", "l1"]  # only lanes below
    assert pick_victims(running, {"high": 1, "normal": 2}, 2) == ["l2", "l1"]
    assert pick_victims(running, {}, 2) == []


def test_the_fewest_times_preempted_go_first_then_the_most_recent() -> None:
    running = [run("l1", "low"), run("l2", "low", 1), run("l3", "low", 1), run("l4", "low")]
    assert pick_victims(running, {"high": 1}, 4) == ["l4"]
    assert pick_victims(running, {"high": 3}, 4) == ["l4", "l1", "l3"]
    # the lane still comes first: a low job preempted 3 times goes before a fresh normal one
    assert pick_victims([run("n1", "normal"), run("l1", "low", 3)], {"high": 2}, 4) == [
        "l1", "n1"]


def test_between_tenants_the_fewest_times_preempted_go_first_then_the_most_recent() -> None:
    """fair_victims.lua takes the first job (in the order given) of the tenant that makes
    room. Most recent first alone would send a job back again as soon as it resumed (it is
    its tenant's newest here) until it reached preempt_max, and then it would hold its slot
    against every waiting tenant."""
    asked: list[list[str]] = []

    def fair_victims(_queue: str, running: list[str], _claim_ms: int) -> tuple[str, None]:
        asked.append(running)
        return "none", None

    me = SimpleNamespace(store=SimpleNamespace(fair_victims=fair_victims), model="m",
                         settings=Settings(fair_share=True), _between_tenants=True,
                         _saw_waiting=False, preempt=lambda _victims: [])
    # in the order their attempts started; h3 just resumed after its second preemption
    pool = [(SimpleNamespace(job_id=j.job_id), j) for j in (
        run("h1", "normal"), run("h2", "normal", 1), run("x", "low"), run("h3", "normal", 2),
        run("h4", "normal"), run("h5", "normal", 4))]  # h5: at preempt_max (4)
    assert Preemptor._fair(me, pool, {"normal": 1}) == []  # type: ignore[arg-type]
    assert asked == [["h4", "h1", "h2", "h3"]]


def test_a_job_preempted_preempt_max_times_keeps_its_slot() -> None:
    running = [run("l1", "low", 2), run("l2", "low", 1)]
    assert pick_victims(running, {"high": 2}, 2) == ["l2"]
    assert pick_victims(running, {"high": 2}, 0) == []  # off


def test_a_preemption_written_after_the_lease_expired_still_counts(r: redis.Redis) -> None:
    """A failover: the victim is stopped, Redis is away long enough for its lease to expire,
    and the preemption is written when Redis is back. No newer attempt took the job, so it is
    still the worker's to hand back, and it does not count against max_attempts."""
    create(r)
    assert attempt_of(acquire(r, "w1", max_attempts=1)) == 1
    r.delete(keys.job_lease(JOB))  # expired while Redis was away
    assert preempt(r, "w1", 1) is True
    assert r.hget(keys.job(JOB), "preemptions") == "1"
    assert attempt_of(acquire(r, "w2", max_attempts=1)) == 2
    r.delete(keys.job_lease(JOB))
    assert preempt(r, "w1", 1) is False  # attempt 2 took it: no longer attempt 1's


def test_attempts_lost_while_their_worker_lived_do_not_use_up_max_attempts(
        r: redis.Redis) -> None:
    """Each time, the lease expires while the worker cannot reach Redis (a failover), a
    takeover runs the job again, and the first worker, back, learns its attempt is gone
    (renew_job). Those are not attempts whose worker died: the job is not failed."""
    create(r)
    for n in (1, 2, 3, 4):  # max_attempts is 2
        assert attempt_of(acquire(r, f"w{n}", max_attempts=2)) == n
        if n > 1:
            assert renew_job(r, f"w{n - 1}", n - 1) is False  # superseded, alive
            assert renew_job(r, f"w{n - 1}", n - 1) is False  # noted once
        r.delete(keys.job_lease(JOB))
    assert r.hget(keys.job(JOB), "survivals") == "3"
    assert attempt_of(acquire(r, "w5", max_attempts=2)) == 5  # w4 never came back: 1 lost
    r.delete(keys.job_lease(JOB))  # nor w5: two lost, the bound
    assert acquire(r, "w6", max_attempts=2) == Skipped(SkipReason.EXHAUSTED)


def test_a_preemption_is_written_once_redis_is_back() -> None:
    """Redis away when the victim is stopped (a failover): the write is tried again, not
    dropped (a dropped one would leave the attempt to be taken over as a lost one)."""
    calls: list[int] = []

    def write(*_: object) -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise redis.ConnectionError("no master")
        return True

    me = SimpleNamespace(store=SimpleNamespace(preempt=write), worker_id="w1",
                         _stop=threading.Event())
    handle = SimpleNamespace(job_id=JOB, attempt=1)
    messages = (task_message(create_celery(Settings(redis_url="redis://127.0.0.1:1/0")), JOB,
                             "q"), "")
    assert Preemptor._write(me, handle, "q", messages) is True  # type: ignore[arg-type]
    assert len(calls) == 3
