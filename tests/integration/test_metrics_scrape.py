"""The API's /metrics: scrapes that overlap each see the whole cluster view, and who may
read it (with keys: a `metrics` or `admin` key, for /metrics and /metrics/targets alike)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tests.integration.test_metrics import value
from tokenq.api.app import create_app
from tokenq.shared import keys
from tokenq.shared.redis_server import EmbeddedRedis

MODELS = [f"fake-m{n}" for n in range(8)]


def beat(r: redis.Redis, wid: str, model: str, running: int) -> None:
    r.hset(keys.WORKERS, wid, json.dumps({
        "model": model, "backend": "fake", "slots": 4, "running": running, "waiting": 1,
        "kv_cache_usage": 0.25, "ts": time.time(), "metrics_port": 9100,
        "metrics_host": "10.9.9.9"}))


def test_overlapping_scrapes_each_see_the_whole_view(
        redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path) -> None:
    for n, model in enumerate(MODELS):
        beat(r, f"w{n}:1", model, running=n % 4)
        for prio in keys.PRIORITIES:
            r.lpush(keys.queue(model, prio), *["{}"] * (n + 1))
    # the beats stay live however long the scrapes take on a busy machine
    settings = fake_settings(redis_server, tmp_path, MODELS).model_copy(
        update={"worker_ttl_s": 3600})
    with TestClient(create_app(settings)) as c, ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(lambda _: c.get("/metrics").text, range(160)))
    for text in texts:
        for n, model in enumerate(MODELS):
            for prio in keys.PRIORITIES:
                assert value(text, "tokenq_queue_depth", model=model, priority=prio) == n + 1
            assert value(text, "tokenq_workers", model=model, backend="fake") == 1
            assert value(text, "tokenq_num_requests_running", model=model) == n % 4
            assert value(text, "tokenq_num_requests_waiting", model=model) == 3 * (n + 1) + 1
            assert value(text, "tokenq_free_slots", model=model) == 4 - n % 4
            assert value(text, "tokenq_kv_cache_usage_ratio", model=model) == 0.25


KEYS = "k-alice:acme,k-prom:prom:metrics,k-ops:ops:admin"


@pytest.mark.parametrize("path", ["/metrics", "/metrics/targets"])
def test_with_keys_metrics_need_a_metrics_key(
        path: str, redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path) -> None:
    beat(r, "w0:1", MODELS[0], running=0)
    settings = fake_settings(redis_server, tmp_path, MODELS[:1])
    with TestClient(create_app(settings, api_keys=KEYS)) as c:
        resp = c.get(path)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        resp = c.get(path, headers={"Authorization": "Bearer k-alice"})
        assert resp.status_code == 403, resp.text
        assert resp.json()["error"]["code"] == "permission_denied"
        for key in ("k-prom", "k-ops"):
            resp = c.get(path, headers={"Authorization": f"Bearer {key}"})
            assert resp.status_code == 200, (key, resp.text)
        assert c.get("/health").status_code == 200  # probes stay open


@pytest.mark.parametrize("path", ["/metrics", "/metrics/targets"])
def test_without_keys_metrics_are_open(
        path: str, redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path) -> None:
    beat(r, "w0:1", MODELS[0], running=0)
    with TestClient(create_app(fake_settings(redis_server, tmp_path, MODELS[:1]))) as c:
        assert c.get(path).status_code == 200
