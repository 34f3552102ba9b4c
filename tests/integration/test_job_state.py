"""The job state machine's Lua scripts on a real Redis, through the job store: lease,
fencing, one terminal state."""

from __future__ import annotations

import json
import time

import redis

from tokenq.shared import keys
from tokenq.shared.jobs import (
    Acquired,
    AcquireResult,
    Appended,
    Cancelled,
    Created,
    Ended,
    Ending,
    IdemKey,
    KeyReused,
    QueueFull,
    Replayed,
    Skipped,
    SkipReason,
    TenantFull,
    TokenWrite,
    dumps,
)
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.shared.store import JobStore

JOB = "job_t1"
TENANT_QUEUED = keys.tenant_queued("t")
MSG = dumps({"properties": {"delivery_tag": "tag1"}})
MSG2 = dumps({"properties": {"delivery_tag": "tag2"}})
SPEC = JobSpec(prompt="hi", params=SamplingParams(
    max_tokens=4, temperature=0, top_p=1, top_k=0, repetition_penalty=1)).model_dump_json()
SETTINGS = Settings(stream_maxlen=1000, result_ttl_s=60,
                    worker=WorkerSettings(lease_ttl_s=60, max_attempts=3))


def store(r: redis.Redis, **worker: float) -> JobStore:
    """A store whose worker settings are SETTINGS' with `worker` changed."""
    return JobStore(r, SETTINGS.model_copy(
        update={"worker": SETTINGS.worker.model_copy(update=worker)}))


def create(r: redis.Redis, limit: int = 0, deadline: float | None = None,
           tenant_limit: int = 0) -> object:
    fields = {"id": JOB, "owner": "t", "model": "m", "state": "queued", "attempts": "0",
              "created_at": repr(time.time()), "spec": SPEC, "request": "{}"}
    if deadline is not None:
        fields["deadline"] = repr(deadline)
    return store(r).create(JOB, fields, tenant="t", queue="q", message=MSG, queue_limit=limit,
                           tenant_limit=tenant_limit)


def acquire(r: redis.Redis, worker: str = "w1", max_attempts: int = 3) -> AcquireResult:
    return store(r, max_attempts=max_attempts).acquire(JOB, worker)


def attempt_of(got: AcquireResult) -> int:
    assert isinstance(got, Acquired), got
    assert got.spec.prompt == "hi"  # the spec the API wrote, typed
    return got.attempt


def finish(r: redis.Redis, attempt: int, state: str = "succeeded", event: str = "done") -> bool:
    return store(r).finish(Ending(JOB, attempt, state, {"output": "x"}, event, "{}"))


def append(r: redis.Redis, attempt: int, *tokens: tuple[str, int, int]) -> Appended:
    """(text, token id, index) per token, as one engine step."""
    writes = [TokenWrite(dumps({"text": t, "index": i}), tid, i) for t, tid, i in tokens]
    return store(r).write_step({(JOB, attempt): writes}, [])[0][0].status


def cancel(r: redis.Redis) -> Cancelled:
    return store(r).cancel(JOB)


def events(r: redis.Redis) -> list[str]:
    return [f["e"] for _, f in r.xrange(keys.job_events(JOB))]


def test_create_writes_record_message_and_queued_event(r: redis.Redis) -> None:
    got = create(r)
    assert got == Created(0) and (got.position, got.eta_s) == (0, 0)  # idle pool: at once
    assert r.hget(keys.job(JOB), "state") == "queued"
    assert r.lrange("q", 0, -1) == [MSG]
    assert events(r) == ["queued"]
    assert json.loads(r.xrange(keys.job_events(JOB))[0][1]["d"]) == {
        "position": 0, "eta_s": 0, "reason": "waiting"}


def test_create_refuses_when_queue_full(r: redis.Redis) -> None:
    r.lpush("q", "a", "b")
    assert create(r, limit=2) == QueueFull(2)
    assert not r.exists(keys.job(JOB)) and r.llen("q") == 2


def test_tenant_queued_limit_counts_only_queued_jobs(r: redis.Redis) -> None:
    r.zadd(TENANT_QUEUED, {"other": 1})
    assert create(r, tenant_limit=1) == TenantFull(1)
    r.delete(TENANT_QUEUED)
    assert create(r, tenant_limit=1) == Created(0)
    assert r.zcard(TENANT_QUEUED) == 1
    acquire(r)  # running jobs no longer count against the tenant's queued limit
    assert r.zcard(TENANT_QUEUED) == 0


def test_idempotency_key_is_set_with_the_job_and_answers_its_job(r: redis.Redis) -> None:
    idem_key = keys.idempotency("t", "job", "k1")
    st = store(r)

    def create_with(job_id: str, body_sha: str) -> object:
        fields = {"id": job_id, "owner": "t", "model": "m", "state": "queued",
                  "attempts": "0", "created_at": repr(time.time()), "spec": SPEC,
                  "request": "{}"}
        return st.create(job_id, fields, tenant="t", queue="q", message=MSG,
                         idem=IdemKey(idem_key, body_sha, 60))

    assert create_with(JOB, "sha-a") == Created(0)
    assert r.get(idem_key) == f"{JOB}|sha-a" and 0 < r.ttl(idem_key) <= 60
    # the same key again: the first job, and nothing new is created
    assert create_with("job_t2", "sha-a") == Replayed(JOB)
    assert create_with("job_t3", "sha-b") == KeyReused(JOB)
    assert not r.exists(keys.job("job_t2")) and not r.exists(keys.job("job_t3"))
    assert r.llen("q") == 1
    # a key whose job is gone no longer binds: the next request makes a job and takes it
    r.delete(keys.job(JOB))
    assert create_with("job_t4", "sha-b") == Created(1)
    assert r.get(idem_key) == "job_t4|sha-b"


def test_replayed_token_step_is_written_once(r: redis.Redis) -> None:
    create(r)
    acquire(r)
    step = [("a", 1, 0), ("b", 2, 1)]
    assert append(r, 1, *step) is Appended.WRITTEN
    assert append(r, 1, *step) is Appended.WRITTEN  # a retry after a cut pipeline
    assert append(r, 1, ("d", 4, 3)) is Appended.WRITTEN  # a gap: not written
    assert events(r) == ["queued", "started", "token", "token"]


def test_duplicate_delivery_with_live_lease_drops_itself(r: redis.Redis) -> None:
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    assert acquire(r, "w2") == Skipped(SkipReason.BUSY)
    assert r.hget(keys.job(JOB), "attempts") == "1"
    assert events(r) == ["queued", "started"]


def test_stale_attempt_is_fenced_off(r: redis.Redis) -> None:
    create(r)
    acquire(r, "w1")
    r.delete(keys.job_lease(JOB))  # w1's lease expired (it froze)
    assert attempt_of(acquire(r, "w2")) == 2
    assert append(r, 1, ("old", 5, 0)) is Appended.FENCED
    assert append(r, 2, ("new", 5, 0)) is Appended.WRITTEN
    assert finish(r, 1) is False
    assert finish(r, 2) is True
    assert finish(r, 2) is False  # exactly one terminal write
    assert events(r) == ["queued", "started", "started", "token", "done"]
    assert r.ttl(keys.job(JOB)) > 0 and r.ttl(keys.job_events(JOB)) > 0
    assert acquire(r, "w3") == Skipped(SkipReason.TERMINAL)


def test_attempts_are_bounded(r: redis.Redis) -> None:
    create(r)
    for n in (1, 2, 3):
        assert attempt_of(acquire(r, f"w{n}", max_attempts=3)) == n
        r.delete(keys.job_lease(JOB))  # the worker died
    assert acquire(r, "w4", max_attempts=3) == Skipped(SkipReason.EXHAUSTED)
    h = r.hgetall(keys.job(JOB))
    assert h["state"] == "failed" and json.loads(h["error"])["code"] == "max_attempts"
    assert events(r)[-1] == "error"


def test_a_worker_dying_while_compiling_the_grammar_poisons_the_job(r: redis.Redis) -> None:
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    store(r).mark_grammar(JOB, 1)
    r.delete(keys.job_lease(JOB))  # the grammar killed w1 before clear_grammar
    assert acquire(r, "w2") == Skipped(SkipReason.POISON)
    h = r.hgetall(keys.job(JOB))
    assert h["state"] == "failed" and json.loads(h["error"])["code"] == "grammar_crashed"
    assert h["attempts"] == "1" and events(r)[-1] == "error"


def test_a_grammar_that_compiled_leaves_no_mark(r: redis.Redis) -> None:
    create(r)
    acquire(r, "w1")
    store(r).mark_grammar(JOB, 1)
    store(r).clear_grammar(JOB)
    r.delete(keys.job_lease(JOB))  # the worker died later, for another reason
    assert attempt_of(acquire(r, "w2")) == 2


def test_deadline_passed_in_queue_expires(r: redis.Redis) -> None:
    create(r, deadline=time.time() - 1)
    assert acquire(r) == Skipped(SkipReason.EXPIRED)
    assert r.hget(keys.job(JOB), "state") == "expired"


def test_cancel_queued_then_running(r: redis.Redis) -> None:
    create(r)
    assert cancel(r) is Cancelled.CANCELLED
    assert acquire(r) == Skipped(SkipReason.TERMINAL)
    assert events(r) == ["queued", "cancelled"]
    r.flushdb()
    create(r)
    acquire(r)
    assert cancel(r) is Cancelled.REQUESTED
    assert r.hget(keys.job(JOB), "cancel_requested") == "1"
    # The worker's next token write still lands, and answers "stop this job now".
    assert append(r, 1, ("a", 1, 0)) is Appended.CANCEL_REQUESTED
    assert events(r)[-1] == "token"


def test_renew_only_own_lease(r: redis.Redis) -> None:
    create(r)
    acquire(r, "w1")
    longer = store(r, lease_ttl_s=90)
    assert longer.renew([(JOB, 1)], "w1") == [True]
    assert r.pttl(keys.job_lease(JOB)) > 60000
    assert longer.renew([(JOB, 1)], "w2") == [False]


def renew_job(r: redis.Redis, worker: str, attempt: int) -> bool:
    return store(r, lease_ttl_s=90).renew([(JOB, attempt)], worker)[0]


def test_job_lease_expired_during_a_stall_is_taken_back_only_while_still_ours(
        r: redis.Redis) -> None:
    """A worker frozen past its lease (GC pause, stalled VM) keeps its job if no takeover
    happened meanwhile; once a newer attempt took it, or it ended, the lease stays lost."""
    create(r)
    r.delete("q")
    acquire(r, "w1")
    assert renew_job(r, "w1", 1) and r.pttl(keys.job_lease(JOB)) > 60000
    assert not renew_job(r, "w2", 1)  # not w2's
    r.delete(keys.job_lease(JOB))  # expired while w1 was stalled
    assert renew_job(r, "w1", 1)
    assert r.get(keys.job_lease(JOB)) == "w1|1"
    assert not requeue(r)  # the reconcile that runs next finds a live lease
    r.delete(keys.job_lease(JOB))  # stalled again, and this time ...
    assert requeue(r)  # ... a reconciler re-enqueued it
    assert renew_job(r, "w1", 1)  # before the copy was taken: w1 keeps it
    assert acquire(r, "w2") == Skipped(SkipReason.BUSY)  # the copy drops itself
    r.delete(keys.job_lease(JOB))
    assert attempt_of(acquire(r, "w2")) == 2  # a takeover happened
    r.delete(keys.job_lease(JOB))
    assert not renew_job(r, "w1", 1)  # the old attempt cannot take it back
    assert finish(r, 2)
    assert not renew_job(r, "w2", 2)  # ended: nothing to renew
    assert not r.exists(keys.job_lease(JOB))


TICKET = dumps({"properties": {"delivery_tag": "ticket"}})


def requeue(r: redis.Redis) -> bool:
    return store(r).requeue(JOB, "q", MSG2, TICKET)


def test_queued_job_whose_message_was_lost_is_rescued_once(r: redis.Redis) -> None:
    create(r)
    assert r.zrange(keys.QUEUED, 0, -1) == [keys.job(JOB)]
    assert not requeue(r)  # its ticket is still in the queue
    r.delete("q")  # popped by a worker that died before kombu recorded it as unacked
    assert requeue(r) and r.lrange("q", 0, -1) == [TICKET]  # a ticket: the lane's job
    assert not requeue(r)
    r.delete(keys.lane_list(keys.lane("q"), "t"))  # its id lost too: put back, with a ticket
    assert requeue(r) and r.lrange("q", 0, -1) == [TICKET, TICKET]
    assert r.lrange(keys.lane_list(keys.lane("q"), "t"), 0, -1) == [JOB]
    acquire(r)
    assert r.zrange(keys.QUEUED, 0, -1) == []


def test_running_index_and_requeue_after_lease_expiry(r: redis.Redis) -> None:
    create(r)
    r.delete("q")
    acquire(r, "w1")
    assert r.zrange(keys.RUNNING, 0, -1) == [keys.job(JOB)]
    assert not requeue(r)  # live lease: nothing to do
    r.delete(keys.job_lease(JOB))  # the worker died
    assert requeue(r) and r.lrange("q", 0, -1) == [MSG2]
    assert not requeue(r)  # exactly once, however many workers reconcile
    r.delete("q")
    r.hset(keys.KOMBU_UNACKED, "tag2", "x")  # a worker took the message, not yet ACQUIREd
    assert not requeue(r)
    r.delete(keys.KOMBU_UNACKED)  # ... and died before recording it: the message is gone
    assert requeue(r) and r.lrange("q", 0, -1) == [MSG2]
    assert attempt_of(acquire(r, "w2")) == 2  # the takeover
    assert r.zrange(keys.RUNNING, 0, -1) == [keys.job(JOB)]
    assert finish(r, 2)
    assert r.zrange(keys.RUNNING, 0, -1) == []


def test_publisher_tells_the_engine_of_a_cancel_within_one_step(r: redis.Redis) -> None:
    """A cancel requested while the job streams reaches the engine on the next token
    write (no poll interval), once, however many steps are still in flight."""
    from tokenq.workers.engines.base import StepOutput, TokenDelta
    from tokenq.workers.publisher import Publisher

    create(r)
    acquire(r)
    told: list[str] = []
    pub = Publisher(store(r), on_cancel=told.append)
    pub.start()
    try:
        pub.track(JOB, 1)
        pub.sink(StepOutput([TokenDelta(JOB, 1, 0, "a", 1)], []))
        cancel(r)
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
    from tokenq.workers.engines.base import StepOutput, TokenDelta
    from tokenq.workers.publisher import Publisher

    create(r)
    acquire(r)
    pub = Publisher(store(r))
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


def _script_calls(r: redis.Redis) -> int:
    stats: dict[str, dict[str, int]] = r.info("commandstats")  # type: ignore[assignment]
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_script"))


def test_a_step_is_one_round_trip_and_survives_redis_forgetting_its_scripts(
        r: redis.Redis) -> None:
    """A step's writes go as EVALSHA in one pipeline, with no SCRIPT EXISTS before it
    (redis-py's pipelined scripts send one per execute: a round trip more per token step).
    After SCRIPT FLUSH (what a restart or a failover does to the cache) the refused calls
    are sent again once their scripts are loaded, so no token and no ending is lost."""
    create(r)
    got = acquire(r)
    assert isinstance(got, Acquired)
    s = store(r)

    def step(i: int) -> None:
        s.write_step({(JOB, got.attempt): [TokenWrite(f'{{"text": "t{i}"}}', i, i)]}, [])

    step(0)  # scripts loaded by now
    before = _script_calls(r)
    step(1)
    assert _script_calls(r) == before  # no SCRIPT EXISTS, no SCRIPT LOAD
    r.script_flush()
    flushed = _script_calls(r)
    step(2)
    assert _script_calls(r) == flushed + 1  # one SCRIPT LOAD, then the step once more
    _, finished = s.write_step({}, [Ending(JOB, got.attempt, "succeeded", {}, "done", "{}", 3)])
    assert finished[0].status is Ended.ENDED
    assert [f["e"] for _, f in r.xrange(keys.job_events(JOB))] == [
        "queued", "started", "token", "token", "token", "done"]
    assert r.hget(keys.job(JOB), "n_tokens") == "3"


def test_an_attempt_ends_cancelled_only_when_a_cancel_was_requested(r: redis.Redis) -> None:
    """The engine cancels by job: a cancel meant for a fenced-off attempt can hit the newer
    attempt the same worker took meanwhile (seen in the cluster suite's failover: a batch
    line ended `cancelled` that nobody cancelled). Its `cancelled` ending lets go of the
    lease instead, and a takeover continues the job."""
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    assert append(r, 1, ("a", 1, 0)) is Appended.WRITTEN
    assert finish(r, 1, state="cancelled", event="cancelled") is False
    assert r.hget(keys.job(JOB), "state") == "running"
    assert not r.exists(keys.job_lease(JOB))  # let go: the reconciler re-enqueues it
    assert attempt_of(acquire(r, "w1")) == 2
    assert finish(r, 2) is True
    assert r.hget(keys.job(JOB), "state") == "succeeded"
    r.flushdb()
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    assert cancel(r) is Cancelled.REQUESTED  # asked for: it ends cancelled
    assert finish(r, 1, state="cancelled", event="cancelled") is True
    assert r.hget(keys.job(JOB), "state") == "cancelled"
