"""`tokenq up -m PATH.gguf`: a GGUF file served without a models file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tokenq.client import Client
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import default_models
from tokenq.shared.weights import gguf_path

pytestmark = pytest.mark.slow


def test_up_serves_a_gguf_path(tmp_path: Path) -> None:
    gguf = tmp_path / "My-Model.Q8.gguf"
    gguf.symlink_to(gguf_path(default_models()["smollm2-135m-instruct"], tmp_path))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env["TOKENQ_STATE_DIR"] = str(tmp_path / "state")
    tokenq = Path(sys.executable).parent / "tokenq"
    proc = subprocess.Popen([str(tokenq), "up", "-m", str(gguf), "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "tokenq up exited"
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.3)
        models = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        assert [m["id"] for m in models] == ["my-model.q8"]
        with Client(url) as tq:
            job = tq.submit("my-model.q8", "Say hi", max_tokens=6)
            assert tq.wait(job.id, timeout=120).status == "succeeded"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
