"""A stack on the fake engine (own Redis with AOF, API, workers) and the checks every
fault scenario ends with: each job terminal exactly once, its tokens contiguous and
exactly the text the fake engine emits."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.schemas import TERMINAL_EVENTS, TERMINAL_STATES
from tokenq.shared.settings import Settings
from tokenq.workers.engines.fake import expected_output

FAKE = "fake"
FAKE_IDLE = "fake-idle"  # served by the API, consumed by no worker: its jobs stay queued

# Short leases and quick reconciles so takeovers happen within seconds in tests.
BASE_ENV = {
    "TOKENQ_WORKER__LEASE_TTL_S": "3", "TOKENQ_WORKER__HEARTBEAT_S": "0.5",
    "TOKENQ_WORKER__RECONCILE_S": "0.5", "TOKENQ_WORKER__DRAIN_GRACE_S": "1",
    "TOKENQ_WORKER__RESCUE_AFTER_S": "2", "TOKENQ_WORKER_TTL_S": "5",
    "TOKENQ_UNACKED_RESTORE_S": "1", "TOKENQ_VISIBILITY_TIMEOUT_S": "60",
    "TOKENQ_API__DRAIN_S": "2",
}


@contextmanager
def fake_stack(tmp: Path, *, workers: int = 2, rate: float = 40.0, slots: int = 8,
               env: dict[str, str] | None = None) -> Iterator[Stack]:
    models = {FAKE: {"backend": "fake", "n_parallel": slots, "fake_tokens_per_s": rate,
                     "n_ctx": 65536},
              FAKE_IDLE: {"backend": "fake", "n_parallel": slots, "n_ctx": 65536}}
    (tmp / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json")
    st = Stack(settings, workers=workers, models=[FAKE, FAKE_IDLE],
               quiet=True, drain_timeout_s=10, env={**BASE_ENV, **(env or {})})
    st.start_parts(worker_models=[FAKE])
    try:
        st.wait_ready(models=[FAKE], timeout=120)
        yield st
    finally:
        st.stop()


@contextmanager
def supervisor(stack: Stack) -> Iterator[list[int]]:
    """Restart workers that die, as `tokenq up` does; yields the list of restarts."""
    stop = threading.Event()
    restarts: list[int] = []

    def loop() -> None:
        while not stop.wait(0.5):
            if stack.restart_dead_workers():
                restarts.append(1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield restarts
    finally:
        stop.set()
        t.join()


def redis_of(stack: Stack) -> redis.Redis:
    return redis.Redis.from_url(stack.redis_url, decode_responses=True)


def submit(client: httpx.Client, n: int, max_tokens: int, prompt: str = "go",
           model: str = FAKE, **extra: Any) -> list[str]:
    ids = []
    for _ in range(n):
        resp = client.post("/v1/jobs", json={"model": model, "prompt": prompt,
                                             "max_tokens": max_tokens, **extra})
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    return ids


def states(r: redis.Redis, ids: list[str]) -> list[str | None]:
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "state")
    return list(pipe.execute())


def wait_terminal(r: redis.Redis, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = states(r, ids)
        if all(s in TERMINAL_STATES for s in st):
            return
        time.sleep(0.2)
    left = [i for i, s in zip(ids, states(r, ids), strict=True) if s not in TERMINAL_STATES]
    raise AssertionError(f"{len(left)} of {len(ids)} jobs not terminal after {timeout}s: "
                         f"{left[:5]}")


def wait_count(r: redis.Redis, ids: list[str], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(s in TERMINAL_STATES for s in states(r, ids)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} jobs terminal after {timeout}s"
        time.sleep(0.05)


def stamp(entry_id: str) -> float:
    """A stream entry id's time (Redis clock, ms) in seconds."""
    return int(entry_id.split("-")[0]) / 1000


@dataclass
class JobRun:
    """One job as its stream and record tell it."""

    id: str
    state: str
    attempts: int
    duplicates: int
    starts: list[tuple[float, dict[str, Any]]]  # (time, data) of each `started`
    tokens: list[tuple[float, int, str]]  # (time, index, text)
    terminal: list[str]


def read_job(r: redis.Redis, job_id: str) -> JobRun:
    h: dict[str, str] = r.hgetall(keys.job(job_id))  # type: ignore[assignment]
    run = JobRun(job_id, h.get("state", ""), int(h.get("attempts", 0)),
                 int(h.get("duplicates", 0)), [], [], [])
    for entry_id, f in r.xrange(keys.job_events(job_id)):  # type: ignore[union-attr]
        if f["e"] == "started":
            run.starts.append((stamp(entry_id), json.loads(f["d"])))
        elif f["e"] == "token":
            d = json.loads(f["d"])
            run.tokens.append((stamp(entry_id), d["index"], d["text"]))
        elif f["e"] in TERMINAL_EVENTS:
            run.terminal.append(f["e"])
    return run


def check_exactly_once(r: redis.Redis, ids: list[str], max_tokens: int) -> list[JobRun]:
    """Every job succeeded once, with exactly the fake engine's text: no gap, no duplicate."""
    runs = [read_job(r, i) for i in ids]
    for run in runs:
        assert run.state == "succeeded", (run.id, run.state)
        assert run.terminal == ["done"], (run.id, run.terminal)
        assert [t[1] for t in run.tokens] == list(range(max_tokens)), run.id
        text = "".join(t[2] for t in run.tokens)
        assert text == expected_output(max_tokens), run.id
        assert r.hget(keys.job(run.id), "output") == text, run.id
    return runs


def worker_id(stack: Stack, proc_index: int) -> str:
    """The id (host:pid) a worker writes into `started` events."""
    import socket

    return f"{socket.gethostname()}:{stack.worker_procs[proc_index][1].pid}"
