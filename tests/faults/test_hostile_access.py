"""Hostile tenant, access (issue 17 items 6-priority, 7, 8): production refuses to start
without keys on every entry point, no addresses, paths, Redis errors or webhook tokens
reach a tenant or a log, adapters are their owner's, `priority: high` is a permission."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from tests.faults.harness import FAKE, submit, wait_terminal
from tests.faults.hostile import client, hostile, hredis, logs_of
from tests.faults.test_abusive_input import assert_envelope
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.redis_server import free_port

__all__ = ["hostile", "hredis"]  # fixtures, used by name

NO_KEYS_PROD = {"TOKENQ_ENV": "production", "TOKENQ_REDIS_URL": "redis://:pw@127.0.0.1:1/0",
                "TOKENQ_API_KEYS": "", "TOKENQ_API__KEYS_FILE": ""}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update({k: v for k, v in extra.items() if v})
    return env


def test_production_without_keys_refuses_every_entry_point() -> None:
    """The documented uvicorn factory, the API module and the CLI: each exits non-zero
    naming the missing keys, and none ever listens."""
    port = free_port()
    commands = [
        [sys.executable, "-m", "uvicorn", "tokenq.api.app:app_from_env", "--factory",
         "--host", "127.0.0.1", "--port", str(port)],
        [sys.executable, "-m", "tokenq.api.server", "--host", "127.0.0.1", "--port", str(port)],
        [sys.executable, "-m", "tokenq.cli.main", "api", "--host", "127.0.0.1",
         "--port", str(port)],
    ]
    for cmd in commands:
        done = subprocess.run(cmd, env=_env(NO_KEYS_PROD), cwd=Path.cwd(), timeout=60,
                              capture_output=True, text=True)
        out = done.stdout + done.stderr
        assert done.returncode != 0, (cmd, out[-2000:])
        assert "needs API keys" in out, (cmd, out[-2000:])


def test_metrics_targets_only_for_admin_or_metrics_keys(hostile: Stack) -> None:
    with client(hostile, "alpha") as alpha:
        resp = alpha.get("/metrics/targets")
        assert_envelope(resp, 403)
        assert resp.json()["error"]["code"] == "permission_denied"
    for who in ("prom", "admin"):
        with client(hostile, who) as c:
            resp = c.get("/metrics/targets")
            assert resp.status_code == 200 and resp.json()[0]["targets"], resp.text


def test_ready_does_not_tell_redis_errors() -> None:
    """Unauthenticated /ready with Redis unreachable: a generic word, the detail in the log."""
    from tokenq.api.routes.ops import ready

    class State:  # the attributes /ready reads
        def __init__(self) -> None:
            self.draining = False
            self.redis = aioredis.Redis(host="127.0.0.1", port=free_port(),
                                        password="s3cret-pw", socket_connect_timeout=2)

    async def call() -> Any:
        st = State()
        try:
            return await ready(st, workers=True)  # type: ignore[arg-type]
        finally:
            await st.redis.aclose()

    resp = asyncio.run(call())
    assert resp.status_code == 503
    body = bytes(resp.body).decode()
    assert "unavailable" in body
    for leak in ("127.0.0.1", "Error", "refused", "s3cret"):
        assert leak not in body, body


def test_adapters_belong_to_their_owner(hostile: Stack, tmp_path: Path) -> None:
    secret_dir = tmp_path / "private-weights"
    secret_dir.mkdir()
    (secret_dir / "lora.gguf").write_text("x")
    path = str(secret_dir / "lora.gguf")
    with client(hostile, "admin") as adm, client(hostile, "alpha") as alpha, \
            client(hostile, "beta") as beta:
        for name, extra in (("beta-only", {"owner": "beta"}), ("for-all", {"shared": True})):
            resp = adm.post("/v1/adapters", json={"name": name, "model": FAKE, "path": path,
                                                  **extra})
            assert resp.status_code == 200 and resp.json()["pending_workers"] == [], resp.text
        # alpha: beta's adapter is absent everywhere; the shared one shows no path
        listed = {m["id"]: m for m in alpha.get("/v1/models").json()["data"]}
        assert "beta-only" not in listed and listed["for-all"]["parent"] == FAKE
        assert path not in alpha.get("/v1/models").text
        assert_envelope(alpha.get("/v1/models/beta-only"), 404)
        for route, body in (("/v1/jobs", {"prompt": "hi"}),
                            ("/v1/completions", {"prompt": "hi"}),
                            ("/tokenize", {"prompt": "hi"})):
            resp = alpha.post(route, json={"model": "beta-only", "max_tokens": 2, **body})
            assert_envelope(resp, 404)
            assert resp.json()["error"]["code"] == "model_not_found", resp.text
        shared = alpha.post("/v1/jobs", json={"model": "for-all", "prompt": "hi",
                                              "max_tokens": 2})
        assert shared.status_code == 202
        # beta: its own adapter works; still no path
        mine = beta.get("/v1/models/beta-only")
        assert mine.status_code == 200 and path not in mine.text
        assert beta.post("/v1/jobs", json={"model": "beta-only", "prompt": "hi",
                                           "max_tokens": 2}).status_code == 202
        # the admin sees where it is
        assert path in adm.get("/v1/models").text
        for name in ("beta-only", "for-all"):
            adm.delete(f"/v1/adapters/{name}")


def test_priority_high_is_a_permission(hostile: Stack, hredis: redis.Redis) -> None:
    high = {"model": FAKE, "prompt": "hi", "max_tokens": 2, "priority": "high"}
    with client(hostile, "alpha") as alpha:
        resp = alpha.post("/v1/jobs", json=high)
        assert_envelope(resp, 403)
        assert resp.json()["error"]["param"] == "priority"
        resp = alpha.post("/v1/chat/completions", json={
            "model": FAKE, "max_tokens": 2, "priority": "high",
            "messages": [{"role": "user", "content": "hi"}]})
        assert_envelope(resp, 403)
        assert alpha.post("/v1/jobs", json={**high, "priority": "low"}).status_code == 202
    with client(hostile, "rush") as rush:
        job = submit(rush, 1, 2, priority="high")[0]
    wait_terminal(hredis, [job], 30)
    assert hredis.hget(keys.job(job), "priority") == "high"


def test_webhook_urls_never_reach_a_log(hostile: Stack, hredis: redis.Redis) -> None:
    token = "tok-" + os.urandom(6).hex()
    port = free_port()  # nothing listens: each delivery attempt fails and is logged
    url = f"http://127.0.0.1:{port}/hook/{token}?token={token}"  # (credentials: a 400)
    with client(hostile, "alpha") as alpha:
        job = submit(alpha, 1, 2, metadata={"webhook_url": url})[0]
    wait_terminal(hredis, [job], 30)
    deadline = time.monotonic() + 30  # until the worker has logged an attempt (host only)
    while (time.monotonic() < deadline
           and "webhook evt" not in "".join(logs_of(hostile).values())):
        time.sleep(0.2)
    for name, text in logs_of(hostile).items():
        assert token not in text, (name, [ln for ln in text.splitlines() if token in ln])
