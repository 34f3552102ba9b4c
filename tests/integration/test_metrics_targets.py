"""Prometheus service discovery through the API, and the API-only readiness probe."""

from __future__ import annotations

import httpx

from tests.conftest import GEMMA, NO_WORKER_MODEL, SMOL
from tests.integration.test_metrics import value


def test_metrics_targets_list_every_live_worker_and_they_scrape(client: httpx.Client) -> None:
    groups = client.get("/metrics/targets").json()
    by_model = {g["labels"]["__meta_tokenq_model"]: g for g in groups}
    assert {SMOL, GEMMA} <= set(by_model) and NO_WORKER_MODEL not in by_model
    for model in (SMOL, GEMMA):
        group = by_model[model]
        assert group["labels"]["__meta_tokenq_backend"] == "llama"
        # only __meta_ labels: Prometheus drops them, so the worker's `model` stays `model`
        assert all(k.startswith("__meta_") for k in group["labels"])
        [target] = group["targets"]
        text = httpx.get(f"http://{target}/metrics", timeout=5).text
        assert value(text, "tokenq_kv_cache_usage_ratio", model=model) >= 0


def test_ready_without_workers_checks_redis_only(client: httpx.Client) -> None:
    full = client.get("/ready")  # the session serves a model that never gets a worker
    assert full.status_code == 503 and NO_WORKER_MODEL in full.json()["missing"]
    api_only = client.get("/ready", params={"workers": "false"})
    assert api_only.status_code == 200 and api_only.json()["status"] == "ready"
