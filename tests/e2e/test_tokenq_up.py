"""`tokenq up` started as a user starts it, then stopped with SIGTERM: no process left."""

from __future__ import annotations

import os
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


def _cmdline(process: psutil.Process) -> str:
    """A child's command line; "" for one that has exited. Redis forks a child to write its
    AOF at start: seen as a zombie for the moment before redis-server reaps it (CI hit it)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def test_up_serves_a_job_and_sigterm_leaves_no_process(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env["TOKENQ_STATE_DIR"] = str(tmp_path / "state")
    tokenq = Path(sys.executable).parent / "tokenq"
    proc = subprocess.Popen([str(tokenq), "up", "--port", str(port), "--workers", "1"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "tokenq up exited before it was ready"
            time.sleep(0.3)
        else:
            raise AssertionError("tokenq up never became ready")
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(_cmdline(c) for c in children)
        assert "redis-server" in names and "tokenq.api.server" in names and "worker" in names

        with httpx.Client(base_url=url, timeout=60) as client:
            job = client.post("/v1/jobs", json={
                "model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hi."}]}).json()
            assert [e.event for e in stream_events(client, job["id"])][-1] == "done"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        alive = [c for c in alive if _cmdline(c)]  # an exited child nobody reaped yet is gone
        assert not alive, f"left behind: {[c.pid for c in alive]}"
        redis_dir = tmp_path / "state" / "redis"  # AOF on: 6.2 writes a file, 7.x a dir
        assert (redis_dir / "appendonly.aof").exists() or (redis_dir / "appendonlydir").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
