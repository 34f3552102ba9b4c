"""`tokenq up --autoscale --min 0 --max 1` as a user starts it: no worker until a job
comes, one for the job, none again after the down window, nothing left after SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tokenq.client.sse import stream_events
from tokenq.shared.redis_server import free_port

pytestmark = pytest.mark.slow


def workers(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """Live worker processes under `tokenq up` (an exited one not yet reaped is not)."""
    out = []
    for c in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "worker" in " ".join(c.cmdline()) and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return out


DECISION = re.compile(r"autoscale (\S+): depth=.* -> target=(\d+)")


def first_decisions(log: Path, proc: subprocess.Popen[bytes]) -> dict[str, int]:
    """Wait for the autoscaler's first decision for each served model (it logs every
    decision that differs from the one before, so the first always): model -> target."""
    deadline = time.monotonic() + 60
    while True:
        got: dict[str, int] = {}
        for model, target in DECISION.findall(log.read_text(errors="replace")):
            got.setdefault(model, int(target))
        if len(got) >= 2:  # the chat and the embedding default
            return got
        assert proc.poll() is None and time.monotonic() < deadline, got
        time.sleep(0.1)


def test_up_autoscale_starts_a_worker_for_a_job_and_drains_it(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update(TOKENQ_STATE_DIR=str(tmp_path / "state"), TOKENQ_AUTOSCALE__INTERVAL_S="0.5",
               TOKENQ_AUTOSCALE__DOWN_WINDOW_S="1", TOKENQ_AUTOSCALE__COOLDOWN_S="1",
               TOKENQ_WORKER__HEARTBEAT_S="0.5", TOKENQ_WORKER__DRAIN_GRACE_S="1")
    tokenq = Path(sys.executable).parent / "tokenq"
    log = tmp_path / "up.log"
    with log.open("wb") as out:  # the child keeps its own copy of the file
        proc = subprocess.Popen([str(tokenq), "up", "--port", str(port), "--autoscale",
                                 "--min", "0", "--max", "1"], env=env,
                                stdout=subprocess.DEVNULL, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # up without any worker: the API answers /health
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.3)
        # min 0, empty queue: the autoscaler's first decisions start no worker
        assert set(first_decisions(log, proc).values()) == {0}
        assert workers(proc) == []
        with httpx.Client(base_url=url, timeout=120) as client:
            job = client.post("/v1/jobs", json={"model": "smollm2-135m-instruct",
                                                "prompt": "Hello", "max_tokens": 8}).json()
            # counted while the job runs: once done, the worker may drain at any moment
            seen = [(e.event, len(workers(proc))) for e in stream_events(client, job["id"])]
        assert seen[-1][0] == "done"
        assert {n for event, n in seen if event == "started"} == {1}, seen
        deadline = time.monotonic() + 30
        while workers(proc):  # drained back to min 0
            assert time.monotonic() < deadline, "the worker was not drained"
            time.sleep(0.3)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive, f"left behind: {[c.pid for c in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
