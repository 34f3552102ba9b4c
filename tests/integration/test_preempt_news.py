"""The preemptor hears of a waiting job when it is put on a lane (real Redis, the real
scripts): every script that pushes a lane publishes on the lane's name, the preemptor looks
at once instead of at its next poll, and without news it polls slowly."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from unittest.mock import MagicMock

import pytest
import redis

from tests.integration.test_job_state import JOB, MSG2, SETTINGS, acquire, attempt_of, create
from tests.unit.test_fair_share import Q as FAIR_Q
from tests.unit.test_fair_share import store as fair_store
from tests.unit.test_fair_share import submit, take
from tokenq.shared import keys
from tokenq.shared.store import JobStore
from tokenq.workers import preempt
from tokenq.workers.preempt import LANES, Preemptor
from tokenq.workers.publisher import JobHandle, Publisher

MODEL = "m-news"
HIGH = keys.queue(MODEL, "high")


def news_of(r: redis.Redis, channel: str) -> Any:
    sub = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    sub.subscribe(channel)
    sub.get_message(timeout=1)  # the confirmation
    return sub


def test_each_script_that_pushes_a_lane_announces_it(r: redis.Redis) -> None:
    store = JobStore(r, SETTINGS)
    sub = news_of(r, "q")  # the tests' jobs queue on "q"
    create(r)
    assert attempt_of(acquire(r, "w1")) == 1
    assert store.hand_back(JOB, "w1", 1, "q", MSG2)
    assert attempt_of(acquire(r, "w2")) == 2
    assert store.preempt(JOB, "w2", 2, "q", MSG2)
    assert attempt_of(acquire(r, "w3")) == 3
    r.delete(keys.job_lease(JOB), "q")  # w3 died and its message is gone: the rescue
    assert store.requeue(JOB, "q", MSG2)
    got = []
    while (msg := sub.get_message(timeout=0.5)) is not None:
        got.append(msg["channel"])
    assert got == ["q"] * 4  # create, hand-back, preempt, requeue
    sub.close()


def test_a_job_put_on_a_lane_wakes_the_preemptor_at_once(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preempt, "IDLE_POLL_S", 30.0)  # only news can explain a prompt look
    poll_s = SETTINGS.worker.preempt_poll_s
    publisher = Publisher(JobStore(r, SETTINGS))
    engine = MagicMock(slots=1)
    engine.healthy.return_value = True
    preemptor = Preemptor(JobStore(r, SETTINGS), SETTINGS, celery=MagicMock(),
                          publisher=publisher, engine=engine, model=MODEL, worker_id="w1")
    looks: list[tuple[float, dict[str, int]]] = []
    real_poll = preemptor.poll

    def poll() -> list[str]:
        looks.append((time.monotonic(), {lane: r.llen(keys.queue(MODEL, lane))
                                         for lane in LANES}))
        return real_poll()

    preemptor.poll = poll  # type: ignore[method-assign]
    handle = publisher.track("job-a", 1)
    handle.preemptable = False  # every slot taken, and nothing is ever sent back here
    preemptor.start()
    # every lane it listens to (with fair share, the lowest too: preemption between tenants)
    lanes = [keys.queue(MODEL, lane) for lane in preemptor._lanes()]

    def subscribed() -> bool:
        return all(int(n) == 1 for _, n in r.pubsub_numsub(*lanes))  # type: ignore[union-attr]

    try:
        deadline = time.monotonic() + 10
        while not (looks and subscribed()):
            assert time.monotonic() < deadline, f"not started: {len(looks)} looks"
            time.sleep(0.01)
        # its first looks (at most one per lane's subscribe confirmation); then nothing
        # waits and no news comes: over a window of several poll intervals, no more looks
        time.sleep(max(0.5, 5 * poll_s))
        assert 1 <= len(looks) <= 1 + len(lanes), len(looks)

        t0 = time.monotonic()
        JobStore(r, SETTINGS).create(
            "job-h", {"id": "job-h", "owner": "t", "model": MODEL, "state": "queued",
                      "attempts": "0", "created_at": repr(time.time()), "spec": "{}",
                      "request": "{}"}, tenant="t", queue=HIGH, message=MSG2)
        deadline = t0 + 2.0  # at once, not at its next look (30 s on)
        while time.monotonic() < deadline and not any(w["high"] for _, w in looks):
            time.sleep(0.005)
        assert any(w["high"] for _, w in looks), looks

        # a job waits (none here can be preempted): a flood of news does not make it look
        # more often than once per NEWS_GAP_S
        n, t1 = len(looks), time.monotonic()
        for _ in range(100):  # news every 5 ms
            r.publish(HIGH, "")
            time.sleep(0.005)
        window = time.monotonic() - t1
        assert 3 <= len(looks) - n <= window / preempt.NEWS_GAP_S + 2
        # without news, while the job waits: every preempt_poll_s
        n, t2 = len(looks), time.monotonic()
        deadline = t2 + 10
        while len(looks) - n < 3 or time.monotonic() < t2 + 0.5:
            assert time.monotonic() < deadline, f"{len(looks) - n} looks in 10 s"
            time.sleep(0.01)
        window = time.monotonic() - t2
        assert len(looks) - n <= window / poll_s + 2
    finally:
        preemptor.stop()
        r.publish(HIGH, "")  # wakes it to see the stop
        assert preemptor._thread is not None
        preemptor._thread.join(5)
        assert not preemptor._thread.is_alive()


def test_one_tenants_backlog_on_full_slots_is_not_looked_at_every_poll(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's only tenant holds every slot here and more of its jobs wait: no look can
    free a slot until news comes (fair_victims.lua: 'alone'), so the preemptor looks every
    IDLE_POLL_S, not every preempt_poll_s (20 looks a second, each a script in Redis,
    beside a busy engine); another tenant's job still gets its look, and its slot, at once."""
    monkeypatch.setattr(preempt, "IDLE_POLL_S", 0.5)
    store = fair_store(r)
    submit(store, "a", 4)
    slots = take(store, 2)  # a holds both slots, two more of a's wait
    publisher = Publisher(store)
    for job_id in slots:
        publisher.track(job_id, int(r.hget(keys.job(job_id), "attempts") or 0))
    engine = MagicMock(slots=2)
    engine.healthy.return_value = True
    preemptor = Preemptor(store, store.s, celery=MagicMock(), publisher=publisher,
                          engine=engine, model="m", worker_id="w")
    assert keys.queue("m", "normal") == FAIR_Q  # the lane the fair-share helpers fill
    looks: list[float] = []
    victims: list[str] = []
    real_poll = preemptor.poll

    def poll() -> list[str]:
        looks.append(time.monotonic())
        return real_poll()

    def preempt_(chosen: Sequence[tuple[JobHandle, str, bool]]) -> list[str]:
        victims.extend(handle.job_id for handle, _, _ in chosen)  # noted, not written
        return []

    preemptor.poll = poll  # type: ignore[method-assign]
    preemptor.preempt = preempt_  # type: ignore[method-assign]
    preemptor.start()
    try:
        deadline = time.monotonic() + 10
        while not looks:
            assert time.monotonic() < deadline, "no look"
            time.sleep(0.01)
        t0, n = time.monotonic(), len(looks)
        time.sleep(2.0)  # a measuring window: 40 looks at preempt_poll_s, 4 at IDLE_POLL_S
        window = time.monotonic() - t0
        assert len(looks) - n <= window / preempt.IDLE_POLL_S + 2, len(looks) - n
        assert not victims
        submit(store, "b", 1)  # news: b is owed one of a's slots
        deadline = time.monotonic() + 2.0  # at once, not at the next slow look
        while not victims:
            assert time.monotonic() < deadline, "b's job got no slot"
            time.sleep(0.005)
        assert victims == ["a-1"]  # a's most recently started
    finally:
        preemptor.stop()
        assert preemptor._thread is not None
        preemptor._thread.join(5)
        assert not preemptor._thread.is_alive()
