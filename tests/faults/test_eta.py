"""Position and eta on the fake stack (docs/scheduling.md, "Position and ETA"): a queued
job's GET /v1/jobs/{id} position shrinks as the backlog drains, and its SSE stream
re-sends `queued` updates (no id, at most once a second) until it starts."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import FAKE, fake_stack, redis_of, wait_terminal
from tokenq.client import Client, QueuedEvent
from tokenq.client.sse import RawEvent, stream_events

pytestmark = pytest.mark.timeout(300)

JOBS, MAX_TOKENS = 24, 20  # 2 slots at 40 tokens/s: 4 jobs a second, about 6 s of backlog


def test_position_shrinks_and_the_stream_resends_queued(tmp_path: Path) -> None:
    env = {"TOKENQ_API_KEYS": "k-a:a"}
    with fake_stack(tmp_path, workers=1, slots=2, rate=40.0, env=env) as st:
        r = redis_of(st)
        c = httpx.Client(base_url=st.url, timeout=30, headers={"Authorization": "Bearer k-a"})
        accepted = []
        for _ in range(JOBS):
            resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "go",
                                            "max_tokens": MAX_TOKENS})
            assert resp.status_code == 202, resp.text
            accepted.append(resp.json())
        last = accepted[-1]
        assert last["position"] >= JOBS - 4  # at most the first few were taken meanwhile
        seen: list[tuple[float, RawEvent]] = []

        def watch() -> None:
            for ev in stream_events(c, last["id"], timeout=120):
                seen.append((time.monotonic(), ev))

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        # the Python client: the job object and the stream iterator carry them too
        tq = Client(st.url, api_key="k-a")
        mid = accepted[JOBS // 2]["id"]
        job = tq.get(mid)
        assert job.status != "queued" or (job.position is not None and job.reason == "waiting")
        first = next(iter(tq.stream(last["id"])))
        assert isinstance(first, QueuedEvent) and first.position == last["position"]
        assert first.reason == "waiting"
        positions: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rec = c.get(f"/v1/jobs/{last['id']}").json()
            if rec["status"] != "queued":
                assert rec["position"] is None and rec["eta_s"] is None
                break
            assert rec["reason"] == "waiting"
            positions.append(rec["position"])
            time.sleep(0.2)
        else:
            raise AssertionError(f"job never started; positions seen {positions}")
        # positions only go down, from about the backlog to the front
        assert positions == sorted(positions, reverse=True), positions
        assert positions[0] >= JOBS // 2 and positions[-1] <= 3, positions
        wait_terminal(r, [a["id"] for a in accepted], timeout=120)
        t.join(timeout=30)
        updates = [(at, ev) for at, ev in seen if ev.event == "queued" and ev.id is None]
        # the stream's own `queued` entry first, then updates while it waited
        assert seen[0][1].event == "queued" and seen[0][1].id is not None
        assert len(updates) >= 3, [ev for _, ev in seen if ev.event == "queued"]
        pos = [ev.data["position"] for _, ev in updates]
        assert pos == sorted(pos, reverse=True) and len(set(pos)) == len(pos), pos
        gaps = [b - a for (a, _), (b, _) in itertools.pairwise(updates)]
        assert min(gaps) > 0.8, gaps  # at most once a second (client-side timing)
        assert all(ev.data.get("eta_s") is not None for _, ev in updates[1:]), updates
        assert all(ev.event != "queued" or ev.id is not None
                   for _, ev in seen[[e.event for _, e in seen].index("started"):])
