"""A worker started before its Redis waits for it, one line a try, and starts serving once
Redis comes up (as the API and the autoscaler do). Before, `tokenq worker` against a Redis
not yet listening read the registry instead of the catalogue, printed a 100-line traceback
from its start hook and exited 1: in compose or on Kubernetes, a crash loop until Redis
won the race."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import redis

from tokenq.cli.stack import INSTALLED, ROOT, python_module
from tokenq.shared.redis_server import EmbeddedRedis, free_port

MODEL = "wait-m"


def test_a_worker_started_before_redis_waits_and_then_serves(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "models.json").write_text(json.dumps({MODEL: {"backend": "fake"}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update(TOKENQ_REDIS_URL=f"redis://127.0.0.1:{port}/0", TOKENQ_STATE_DIR=str(tmp_path),
               TOKENQ_MODELS_FILE=str(tmp_path / "models.json"), PYTHONUNBUFFERED="1")
    if not INSTALLED:
        env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(python_module("tokenq.cli.main", "worker", "--model", MODEL),
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = None
    try:
        deadline = time.monotonic() + 60
        while log.read_text().count("cannot reach Redis") < 2:  # two tries, one line each
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert "Traceback" not in log.read_text()
        server = EmbeddedRedis(tmp_path / "redis", port=port).start()
        r = redis.Redis.from_url(server.url, decode_responses=True)
        deadline = time.monotonic() + 90
        while not any(json.loads(v).get("model") == MODEL
                      for v in r.hgetall("tokenq:workers").values()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if server is not None:
            server.stop()
