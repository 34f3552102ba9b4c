"""Prometheus metrics: the API's cluster view and a worker's engine metrics move with jobs."""

from __future__ import annotations

import json
import re
import time

import httpx
import redis

from tests.conftest import NO_WORKER_MODEL, SMOL
from tokenq.client.sse import stream_events


def value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not exported")


def test_cluster_metrics_from_redis(client: httpx.Client) -> None:
    before = client.get("/metrics").text
    assert value(before, "tokenq_workers", model=SMOL, backend="llama") == 1
    depth0 = value(before, "tokenq_queue_depth", model=NO_WORKER_MODEL, priority="low")
    client.post("/v1/jobs", json={"model": NO_WORKER_MODEL, "prompt": "hi", "max_tokens": 2,
                                  "priority": "low"}).raise_for_status()
    after = client.get("/metrics").text  # read from Redis at scrape: no wait needed
    assert value(after, "tokenq_queue_depth", model=NO_WORKER_MODEL, priority="low") == depth0 + 1
    assert value(after, "tokenq_queue_oldest_age_seconds", model=NO_WORKER_MODEL,
                 priority="low") > 0
    assert value(after, "tokenq_num_requests_waiting", model=NO_WORKER_MODEL) >= depth0 + 1
    for name in ("tokenq_num_requests_running", "tokenq_kv_cache_usage_ratio",
                 "tokenq_free_slots"):
        value(after, name, model=SMOL)


def test_worker_engine_metrics_move(client: httpx.Client, stack_redis: redis.Redis) -> None:
    beats = [json.loads(v) for v in stack_redis.hgetall("tokenq:workers").values()]
    port = next(b["metrics_port"] for b in beats if b["model"] == SMOL)
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape(name: str, **labels: str) -> float:
        try:
            return value(httpx.get(url).text, name, **labels)
        except AssertionError:
            return 0.0

    done0 = scrape("tokenq_jobs_total", model=SMOL, state="succeeded")
    gen0 = scrape("tokenq_generation_tokens_total", model=SMOL)
    ttft0 = scrape("tokenq_time_to_first_token_seconds_count", model=SMOL)
    job = client.post("/v1/jobs", json={"model": SMOL, "prompt": "Hello", "max_tokens": 6,
                                        "temperature": 0}).json()
    n = sum(e.event == "token" for e in stream_events(client, job["id"]))
    deadline = time.monotonic() + 10  # the task records just after the terminal write
    while scrape("tokenq_jobs_total", model=SMOL, state="succeeded") == done0:
        assert time.monotonic() < deadline, "tokenq_jobs_total did not move"
        time.sleep(0.1)
    assert scrape("tokenq_jobs_total", model=SMOL, state="succeeded") == done0 + 1
    assert scrape("tokenq_generation_tokens_total", model=SMOL) == gen0 + n
    assert scrape("tokenq_time_to_first_token_seconds_count", model=SMOL) == ttft0 + 1
    assert scrape("tokenq_e2e_request_latency_seconds_count", model=SMOL) >= 1
