"""The embedded redis-server across restarts of one data dir: a big AOF is waited for while
it loads, an AOF that is mostly history is compacted, and a relative data dir works."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from tokenq.shared.redis_server import EmbeddedRedis


def test_an_aof_that_is_mostly_history_is_rewritten_at_start(tmp_path: Path) -> None:
    first = EmbeddedRedis(tmp_path).start()
    r = redis.Redis.from_url(first.url)
    value = "x" * 1024
    for _ in range(4):
        pipe = r.pipeline(transaction=False)
        for i in range(500):
            pipe.set("key", f"{i}{value}")  # 2,000 writes of one 1 KB key
        pipe.execute()
    r.close()
    first.stop()
    aof = sum(f.stat().st_size for f in tmp_path.rglob("appendonly*") if f.is_file())
    assert aof > 2_000_000

    second = EmbeddedRedis(tmp_path, port=first.port)
    second.compact_aof_bytes = 100_000
    second.start()
    r = redis.Redis.from_url(second.url)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = r.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"] and (
                    info["aof_current_size"] < 100_000):
                break
            time.sleep(0.1)
        assert r.info("persistence")["aof_current_size"] < 100_000
        assert r.get("key") == f"499{value}".encode()  # the data itself is all there
    finally:
        r.close()
        second.stop()


def test_a_server_still_loading_its_aof_is_waited_for(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """LOADING past the PING wait is progress: the start waits on (a busy VM once took more
    than the 10 s wait to load a 447 MB AOF, and the bench failed to start)."""
    ping = redis.Redis.ping
    until = time.monotonic() + 1.5

    def loading(self: redis.Redis, **kwargs: object) -> object:
        if time.monotonic() < until:
            raise redis.BusyLoadingError("Redis is loading the dataset in memory")
        return ping(self, **kwargs)

    monkeypatch.setattr(redis.Redis, "ping", loading)
    server = EmbeddedRedis(tmp_path).start(timeout=0.5)  # gave up at 0.5 s before: raised
    r = redis.Redis.from_url(server.url)
    try:
        assert r.set("key", "value") and r.get("key") == b"value"  # and what came up serves
    finally:
        r.close()
        server.stop()


def test_a_relative_data_dir_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOKENQ_STATE_DIR=.tq: redis-server changes into --dir, then opened its log file
    relative to that and exited."""
    monkeypatch.chdir(tmp_path)
    server = EmbeddedRedis(Path(".tq") / "redis").start()
    try:
        assert (tmp_path / ".tq" / "redis" / "redis.log").exists()
    finally:
        server.stop()


def test_loading_is_waited_for_only_up_to_its_own_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forever_loading(*_: object, **__: object) -> object:
        raise redis.BusyLoadingError("Redis is loading the dataset in memory")

    monkeypatch.setattr(redis.Redis, "ping", forever_loading)
    server = EmbeddedRedis(tmp_path)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="did not answer PING in time"):
            server.start(timeout=0.2, loading_timeout=1.0)
        assert 1.0 <= time.monotonic() - t0 < 5.0
    finally:
        server.stop()
