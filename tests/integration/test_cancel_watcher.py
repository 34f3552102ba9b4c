"""The worker's cancel watcher (workers/cancels.py): one pipelined look a poll at every job
in flight; a cancel reaches the engine once, also for a job that writes nothing (which the
token writes' own check cannot see)."""

from __future__ import annotations

import threading
import time

import redis

from tokenq.shared import keys
from tokenq.shared.jobs import dumps
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import ModelConfig, Settings, WorkerSettings
from tokenq.shared.store import JobStore
from tokenq.workers.cancels import CancelWatcher
from tokenq.workers.engines.fake import FakeEngine
from tokenq.workers.runtime import WorkerRuntime
from tokenq.workers.tasks import run_job


def test_each_cancel_is_passed_on_once_and_only_for_watched_jobs(r: redis.Redis) -> None:
    told: list[str] = []
    w = CancelWatcher(r, told.append)
    for job in ("a", "b", "c"):
        w.watch(job, 1)
    assert w.check() == []
    r.hset(keys.job("b"), "cancel_requested", "1")
    r.hset(keys.job("x"), "cancel_requested", "1")  # not watched here
    assert w.check() == ["b"]
    assert w.check() == []  # once
    w.unwatch("b", 1)
    w.watch("b", 2)  # a new attempt of the job on this worker: told again
    assert w.check() == ["b"]
    assert told == ["b", "b"]


def test_an_old_attempt_ending_late_leaves_the_new_one_watched(r: redis.Redis) -> None:
    told: list[str] = []
    w = CancelWatcher(r, told.append)
    w.watch("a", 1)
    w.watch("a", 2)  # preempted, then taken again here before attempt 1's thread ended
    w.unwatch("a", 1)
    r.hset(keys.job("a"), "cancel_requested", "1")
    assert w.check() == ["a"] and told == ["a"]


def test_a_redis_outage_passes_nothing_on() -> None:
    dead = redis.Redis(port=1, socket_connect_timeout=0.2, decode_responses=True)
    told: list[str] = []
    w = CancelWatcher(dead, told.append)
    w.watch("a", 1)
    assert w.check() == [] and told == []


def test_a_job_that_writes_nothing_is_cancelled_within_a_second(r: redis.Redis) -> None:
    """One token, then nothing for 30 s: only the watcher can pass the cancel on."""
    port = r.connection_pool.connection_kwargs["port"]
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/15",
                        worker=WorkerSettings(metrics_port=None))
    cfg = ModelConfig(backend="fake", fake_tokens_per_s=1 / 30, n_parallel=2)
    rt = WorkerRuntime(settings=settings, model="m", cfg=cfg, engine=FakeEngine(cfg),
                       r=redis.Redis(port=port, db=15, decode_responses=True))
    spec = JobSpec(prompt="hi", params=SamplingParams(
        max_tokens=8, temperature=0, top_p=1, top_k=0, repetition_penalty=1)).model_dump_json()
    store = JobStore(r, settings)
    store.create("j1", {"id": "j1", "owner": "t", "model": "m", "state": "queued",
                        "attempts": "0", "created_at": repr(time.time()), "spec": spec,
                        "request": "{}"}, tenant="t", queue="q",
                 message=dumps({"properties": {"delivery_tag": "t1"}}))
    outcome: list[str] = []
    rt.start()
    try:
        th = threading.Thread(target=lambda: outcome.append(run_job(rt, "j1")))
        th.start()
        deadline = time.monotonic() + 10
        while r.hget(keys.job("j1"), "n_tokens") != "1":
            assert time.monotonic() < deadline, "the first token never came"
            time.sleep(0.02)
        store.cancel("j1")
        asked = time.monotonic()
        th.join(timeout=10)
        took = time.monotonic() - asked
    finally:
        rt.close()
    assert outcome == ["cancelled"] and took < 5, (outcome, took)
    assert r.hget(keys.job("j1"), "state") == "cancelled"
