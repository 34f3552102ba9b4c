"""SIGKILL a real llama.cpp worker mid-stream: another worker continues the job's stream."""

from __future__ import annotations

import signal
import time

import httpx

from cli.sse import Event, stream_events
from cli.stack import Stack
from tests.conftest import GEMMA


def test_killed_worker_job_continues_without_gap_or_duplicate(client: httpx.Client,
                                                               stack: Stack) -> None:
    resp = client.post("/v1/jobs", json={"model": GEMMA, "prompt": "Once upon a time, there was",
                                         "max_tokens": 120, "temperature": 0.8, "seed": 5})
    job_id = resp.json()["id"]
    seen: list[Event] = []
    killed_at = None
    for ev in stream_events(client, job_id, timeout=120):  # one client, attached throughout
        seen.append(ev)
        if killed_at is None and sum(e.event == "token" for e in seen) == 10:
            victim = next(p for m, p in stack.worker_procs if m == GEMMA and p.poll() is None)
            victim.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            stack.add_worker(GEMMA)  # what `tokenq up` does when a worker dies
    assert killed_at is not None
    recovered_s = time.monotonic() - killed_at
    kinds = [e.event for e in seen]
    assert kinds[-1] == "done", seen[-1]
    assert [e.data["attempt"] for e in seen if e.event == "started"] == [1, 2]
    toks = [e for e in seen if e.event == "token"]
    assert [t.data["index"] for t in toks] == list(range(len(toks)))  # no gap, no duplicate
    record = client.get(f"/v1/jobs/{job_id}").json()
    assert record["attempts"] == 2 and record["state"] == "succeeded"
    assert record["output"] == "".join(t.data["text"] for t in toks)
    assert record["usage"]["completion_tokens"] == len(toks)
    print(f"takeover: done {recovered_s:.1f}s after the kill")
    assert recovered_s < 30, recovered_s
