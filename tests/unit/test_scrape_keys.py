"""With keys configured the API's /metrics and /metrics/targets need a `metrics` key: the
Prometheus that compose and the k8s manifests ship sends one on both, from a secret that
is mounted where the config reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tokenq.api.auth import PUBLIC_PATHS

COMPOSE = Path(__file__).resolve().parents[2] / "compose"


def bearer_file(job: dict[str, Any]) -> str:
    auth = job["authorization"]
    assert auth["type"] == "Bearer"
    return str(auth["credentials_file"])


def check_jobs(prom: dict[str, Any], mounted: set[str]) -> None:
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["tokenq-api"]["metrics_path"] == "/metrics"
    api_key = bearer_file(jobs["tokenq-api"])
    [sd] = jobs["tokenq-workers"]["http_sd_configs"]
    assert bearer_file(sd) == api_key  # the same `metrics` key for /metrics/targets
    assert api_key.rsplit("/", 1)[0] in mounted, (api_key, mounted)


def test_metrics_are_not_public() -> None:
    assert "/metrics" not in PUBLIC_PATHS and "/metrics/targets" not in PUBLIC_PATHS


def test_compose_prometheus_scrapes_the_api_with_its_key() -> None:
    services = yaml.safe_load((COMPOSE / "compose.yml").read_text())["services"]
    assert "prometheus_key" in services["prometheus"]["secrets"]
    check_jobs(yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text()),
               {"/run/secrets"})


def test_k8s_prometheus_scrapes_the_api_with_its_key() -> None:
    docs = [d for d in yaml.safe_load_all((COMPOSE / "k8s" / "prometheus.yaml").read_text())
            if d]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [deploy] = [d for d in docs if d["kind"] == "Deployment"]
    [prom] = deploy["spec"]["template"]["spec"]["containers"]
    check_jobs(yaml.safe_load(cm["data"]["prometheus.yml"]),
               {m["mountPath"] for m in prom["volumeMounts"]})
