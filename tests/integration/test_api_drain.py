"""SIGTERM to an API replica: /ready and new jobs get 503 (jobs with Retry-After), open
streams finish, it exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests.conftest import GEMMA, SMOL
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events
from tokenq.shared.redis_server import free_port


def test_api_drain_refuses_new_jobs_and_lets_open_streams_finish(stack: Stack) -> None:
    port = free_port()
    env = {**os.environ, "TOKENQ_REDIS_URL": stack.redis_url, "TOKENQ_API__DRAIN_S": "600"}
    proc = subprocess.Popen([sys.executable, "-m", "tokenq.api.server", "--port", str(port)],
                            env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        with httpx.Client(base_url=url, timeout=60) as client:
            job = client.post("/v1/jobs", json={"model": GEMMA, "prompt": "Once upon a time,",
                                                "max_tokens": 60, "temperature": 0.8}).json()
            seen: list[RawEvent] = []
            signalled = threading.Event()
            for ev in stream_events(client, job["id"], timeout=60):
                seen.append(ev)
                if not signalled.is_set() and ev.event == "token":
                    proc.send_signal(signal.SIGTERM)
                    signalled.set()
                    time.sleep(0.3)
                    refused = client.post("/v1/jobs", json={"model": SMOL, "prompt": "hi"})
                    assert refused.status_code == 503, refused.text
                    assert refused.json()["error"]["code"] == "draining"
                    assert refused.headers["retry-after"] == "1"
                    # out of the load balancer's rotation, but alive (no restart)
                    for probe in ("/ready", "/ready?workers=false"):
                        got = client.get(probe)
                        assert (got.status_code, got.json()["status"]) == (503, "draining")
                    assert client.get("/health").status_code == 200
            stream_end = time.monotonic()
        assert seen[-1].event == "done"  # the open stream finished through the drain
        toks = [e for e in seen if e.event == "token"]
        assert [t.data["index"] for t in toks] == list(range(len(toks)))
        # uvicorn re-raises the captured SIGTERM after its clean shutdown (Unix convention)
        assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
        assert time.monotonic() - stream_end < 10  # it left once no stream was open
    finally:
        if proc.poll() is None:
            proc.kill()
