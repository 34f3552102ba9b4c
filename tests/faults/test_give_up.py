"""Processes that give up: a worker cut off from Redis for good exits non-zero after
worker.redis_give_up_s (so its supervisor decides), rather than retrying for ever; its
heartbeat follows an address that changed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import redis as redis_lib

from tests.faults.harness import fake_stack
from tokenq.shared import keys
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import WorkerHeartbeat
from tokenq.shared.settings import Settings
from tokenq.workers.heartbeat import Heartbeat
from tokenq.workers.runtime import EXIT_REDIS_GONE


def test_worker_gives_up_on_a_redis_gone_for_good(tmp_path: Path) -> None:
    with fake_stack(tmp_path, workers=1,
                    env={"TOKENQ_WORKER__REDIS_GIVE_UP_S": "3"}) as st:
        assert st.redis is not None
        [(_, proc)] = st.worker_procs
        st.redis.stop()  # gone, and never back
        gone = time.monotonic()
        deadline = gone + 90  # 3 s to give up, + socket timeouts and a loaded machine
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.returncode == EXIT_REDIS_GONE, (
            f"worker still running {time.monotonic() - gone:.0f} s after Redis went away"
            if proc.returncode is None else proc.returncode)
        print(f"\n[faults] Redis gone for good: the worker exited {EXIT_REDIS_GONE} after "
              f"{time.monotonic() - gone:.1f} s (give-up 3 s)")


def test_a_process_celery_stopped_ends_even_with_a_thread_holding_on() -> None:
    """The net under Celery's "Unrecoverable error": a non-daemon thread that never ends
    does not keep the process alive; it exits with Celery's code."""
    code = ("import threading, time\n"
            "from tokenq.workers.runtime import exit_if_still_alive\n"
            "threading.Thread(target=lambda: time.sleep(600)).start()\n"
            "exit_if_still_alive(1, after_s=0.5)\n")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert out.returncode == 1, out
    assert time.monotonic() - t0 < 50


def test_heartbeat_follows_a_changed_address(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """A worker bound to all interfaces advertises this host's address as it is at each
    beat (a container reconnected to its network gets a new IP)."""
    server = EmbeddedRedis(tmp_path / "r").start()
    try:
        r = redis_lib.Redis.from_url(server.url, decode_responses=True)
        s = Settings(redis_url=server.url)
        s.worker.metrics_addr = "0.0.0.0"
        s.worker.heartbeat_s = 0.05
        ip = ["10.1.0.5"]
        monkeypatch.setattr(socket, "gethostbyname", lambda _: ip[0])
        engine = mock.Mock()
        engine.healthy.return_value = True
        engine.grammar_busy.return_value = []  # no job's grammar running
        engine.stats.return_value = mock.Mock(slots=1, running=0, waiting=0,
                                              kv_cache_usage=0.0, prefix_hit_ratio=0.0,
                                              stopped_steps=0)
        engine.backend, engine.max_model_len = "fake", None
        hb = Heartbeat(r=r, settings=s, worker_id="w1", model="m", engine=engine,
                       adapters=mock.Mock(summary=lambda: {}), metrics=mock.MagicMock(),
                       leases=mock.Mock(), reconciler=mock.Mock(),
                       on_engine_died=mock.Mock(), on_redis_gone=mock.Mock(),
                       metrics_port=9000, metrics_host="10.1.0.5", bound_to_all=True)

        def beat() -> WorkerHeartbeat | None:
            raw = r.hget(keys.WORKERS, "w1")
            return WorkerHeartbeat.model_validate_json(str(raw)) if raw else None

        hb.start()
        try:
            ip[0] = "10.1.0.9"
            changed = time.time()
            # A beat written after the change carries the new address.
            deadline = time.monotonic() + 30
            while ((got := beat()) is None or got.ts <= changed) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert got is not None and got.ts > changed
            assert got.metrics_host == "10.1.0.9"
        finally:
            hb.stop()
    finally:
        server.stop()
