"""An API without keys (every caller its admin) answers only requests that arrive on
loopback, however it is served: the uvicorn factory bound to every interface included."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tokenq.api.app import create_app
from tokenq.cli.bench.peers import wait_http
from tokenq.shared.redis_server import EmbeddedRedis, free_port

MODEL = "fake-guard"
pytestmark = pytest.mark.usefixtures("r")  # db 15, flushed


def outside_address() -> str | None:
    """An address of this machine outside loopback (None: it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # TEST-NET: no packet is sent for a UDP connect
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


@pytest.mark.parametrize(("host", "served"), [
    ("10.1.2.3", False), ("192.168.0.7", False), ("[2001:db8::1]", False),
    ("127.0.0.1", True), ("[::1]", True), ("testserver", True)])
def test_without_keys_only_loopback_is_served(
        host: str, served: bool, redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    app = create_app(fake_settings(redis_server, tmp_path, [MODEL]))
    with TestClient(app, base_url=f"http://{host}:8000") as c:
        for path in ("/health", "/v1/models", "/metrics"):
            resp = c.get(path)
            if served:
                assert resp.status_code == 200, (path, resp.text)
            else:
                assert resp.status_code == 403, (path, resp.text)
                assert resp.json()["error"]["code"] == "loopback_only"


def test_with_keys_every_interface_is_served(redis_server: EmbeddedRedis,
                                             tmp_path: Path) -> None:
    app = create_app(fake_settings(redis_server, tmp_path, [MODEL]), api_keys="k1:acme")
    with TestClient(app, base_url="http://10.1.2.3:8000") as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200


def test_the_uvicorn_factory_on_every_interface_answers_loopback_only(
        redis_server: EmbeddedRedis, tmp_path: Path) -> None:
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no address outside loopback")
    settings = fake_settings(redis_server, tmp_path, [MODEL])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update(TOKENQ_REDIS_URL=settings.redis_url or "", TOKENQ_STATE_DIR=str(tmp_path),
               TOKENQ_MODELS_FILE=str(settings.models_file), TOKENQ_SERVED_MODELS=MODEL)
    port, log = free_port(), tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tokenq.api.app:create_app", "--factory",
             "--host", "0.0.0.0", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
        resp = httpx.get(f"http://{outside}:{port}/v1/models", timeout=5)
        assert resp.status_code == 403 and resp.json()["error"]["code"] == "loopback_only"
        assert httpx.get(f"http://{outside}:{port}/health", timeout=5).status_code == 403
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "refusing requests that arrive on" in log.read_text(), log.read_text()[-2000:]
