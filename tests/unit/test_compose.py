"""compose/ checked by parsing and by following every cross-reference: services, ports,
routes, CLI options, settings, metrics. tests/cluster brings the same file up on Docker;
these checks also cover what it leaves out (Grafana, the GPU worker)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import promql_parser as pq
import pytest
import typer
import yaml

from tests.unit.promql import check
from tokenq.api.app import create_app
from tokenq.cli.main import app as cli_app
from tokenq.shared.settings import ModelConfig, Settings, variable_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"


def load(rel: str) -> Any:
    return yaml.safe_load((COMPOSE / rel).read_text())


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc: dict[str, Any] = load("compose.yml")
    found: dict[str, Any] = doc["services"]
    return found


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m)", duration)
    assert m, duration
    return int(m[1]) * (60 if m[2] == "m" else 1)


def test_compose_wires_every_part(services: dict[str, Any]) -> None:
    assert {"redis", "api", "lb", "cpu-worker", "gpu-worker", "autoscaler", "prometheus",
            "grafana"} <= set(services)
    assert "--requirepass" in services["redis"]["command"]
    assert "--appendonly" in services["redis"]["command"]
    for name in ("api", "cpu-worker", "gpu-worker", "autoscaler"):
        env = services[name]["environment"]
        assert env["TOKENQ_ENV"] == "production" and "@redis:6379" in env["TOKENQ_REDIS_URL"]
        # every TOKENQ_ variable is a real setting (a typo would be silently ignored)
        assert {k for k in env if k.startswith("TOKENQ_")} <= variable_names()
    for name, svc in services.items():
        assert "healthcheck" in svc, f"{name} has no healthcheck"
    assert services["api"]["environment"]["TOKENQ_API__KEYS_FILE"].startswith("/run/secrets/")
    assert "api_keys" in services["api"]["secrets"]


def test_image_is_portable_and_has_no_dev_extras() -> None:
    docker = (COMPOSE / "Dockerfile").read_text()
    assert "--no-index" in docker and "ARG EXTRAS=cpu" in docker
    assert not re.search(r"[\[,]dev\b", docker)
    assert "setup.sh" not in docker  # that build uses the build host's CPU flags
    assert "scripts/llama_portable.sh" in (ROOT / "scripts" / "wheelhouse.sh").read_text()
    portable = (ROOT / "scripts" / "llama_portable.sh").read_text()
    assert "-DGGML_CPU_ALL_VARIANTS=ON" in portable and "-DGGML_BACKEND_DL=ON" in portable
    assert "-DGGML_NATIVE=OFF" in portable


def test_tokenq_commands_parse_with_the_real_cli(services: dict[str, Any]) -> None:
    group = typer.main.get_command(cli_app)
    for name in ("api", "cpu-worker", "gpu-worker", "autoscaler"):
        cmd = services[name]["command"]
        assert cmd[0] == "tokenq", name
        sub = group.get_command(None, cmd[1])  # type: ignore[attr-defined]
        assert sub is not None, f"{name}: no `tokenq {cmd[1]}`"
        # `${VAR:-default}` as compose fills it in when VAR is unset
        args = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in cmd[2:]]
        sub.make_context(cmd[1], args)  # raises on an unknown option or a bad value


def test_gpu_worker_reserves_an_nvidia_gpu_and_serves_a_vllm_model(
        services: dict[str, Any]) -> None:
    gpu = services["gpu-worker"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert gpu["build"]["args"]["EXTRAS"] == "gpu"
    model = gpu["command"][gpu["command"].index("--model") + 1]
    registry = json.loads((COMPOSE / "models.json").read_text())
    assert ModelConfig.model_validate(registry[model]).backend == "vllm"
    assert Path(gpu["environment"]["TOKENQ_MODELS_FILE"]).name == "models.json"
    cfg = ModelConfig.model_validate(registry[model])
    assert cfg.source == "hf" and cfg.path and cfg.path.startswith("/models/")
    mounts = {v.rsplit(":", 2)[-2] for v in gpu["volumes"]}
    assert "/models" in mounts and "/etc/tokenq/models.json" in mounts


def test_drain_fits_in_stop_grace_periods(services: dict[str, Any]) -> None:
    s = Settings(redis_url="redis://:pw@redis:6379/0")
    assert seconds(services["api"]["stop_grace_period"]) > s.api.drain_s
    for name in ("cpu-worker", "gpu-worker", "autoscaler"):
        assert seconds(services[name]["stop_grace_period"]) > s.worker.drain_grace_s, name


def test_prometheus_reaches_the_api_and_every_worker(services: dict[str, Any]) -> None:
    prom = load("prometheus/prometheus.yml")
    routes = set(create_app(Settings()).openapi()["paths"])
    api_port = services["api"]["command"][services["api"]["command"].index("--port") + 1]
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    [dns] = jobs["tokenq-api"]["dns_sd_configs"]  # one target per API replica
    assert dns["names"] == ["api"] and str(dns["port"]) == api_port
    targets = [urlparse(sd["url"]).netloc for j in jobs.values()
               for sd in j.get("http_sd_configs", [])]
    for target in targets:
        host, _ = target.split(":")
        assert host in services, f"scrape target {target}: no such service"
    assert jobs["tokenq-api"]["metrics_path"] in routes
    [sd] = jobs["tokenq-workers"]["http_sd_configs"]
    assert urlparse(sd["url"]).path in routes  # the API's worker discovery route
    # behind an API key, like every /v1 route: Prometheus reads it from its secret
    key_file = sd["authorization"]["credentials_file"]
    assert key_file == "/run/secrets/prometheus_key" and \
        "prometheus_key" in services["prometheus"]["secrets"]
    mounts = {v.split(":")[1] for v in services["prometheus"]["volumes"]}
    assert set(prom["rule_files"]) <= mounts


def test_alert_rules_parse_and_read_real_metrics() -> None:
    rules = {r["alert"]: r for g in load("prometheus/alerts.yml")["groups"]
             for r in g["rules"]}
    read = {name: check(r["expr"]) for name, r in rules.items()}
    assert "tokenq_kv_cache_usage_ratio" in read["TokenqKVCacheNearlyFull"]
    assert "> 0.95" in rules["TokenqKVCacheNearlyFull"]["expr"]
    assert "histogram_quantile(0.99" in rules["TokenqHighP99Latency"]["expr"]
    assert "tokenq_queue_depth" in read["TokenqQueueBacklog"]
    no_worker = pq.parse(rules["TokenqNoWorker"]["expr"])
    op = no_worker.op  # type: ignore[attr-defined]
    assert str(op).lower().endswith("unless")  # waiting, unless a worker is live
    assert read["TokenqNoWorker"] == {"tokenq_num_requests_waiting", "tokenq_workers"}
    for r in rules.values():
        assert re.fullmatch(r"\d+[smh]", r["for"]) and r["labels"]["severity"]


def test_grafana_dashboard_is_provisioned_and_queries_real_metrics(
        services: dict[str, Any]) -> None:
    [ds] = load("grafana/provisioning/datasources/prometheus.yml")["datasources"]
    assert urlparse(ds["url"]).hostname in services
    [provider] = load("grafana/provisioning/dashboards/tokenq.yml")["providers"]
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    dash = json.loads((COMPOSE / "grafana/dashboards/tokenq.json").read_text())
    read: set[str] = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == ds["uid"]
        for target in panel["targets"]:
            read |= check(target["expr"])
    assert {"tokenq_queue_depth", "tokenq_time_to_first_token_seconds_bucket",
            "tokenq_time_per_output_token_seconds_bucket",
            "tokenq_e2e_request_latency_seconds_bucket", "tokenq_generation_tokens_total",
            "tokenq_workers", "tokenq_kv_cache_usage_ratio"} <= read
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.95," in exprs


def test_profile_ha_is_a_sentinel_deployment_the_app_can_find(services: dict[str, Any]) -> None:
    """Profile ha: the primary, two replicas of it, three sentinels (quorum 2) monitoring it
    under the name the app asks for; the app's sentinel settings come from the environment
    and are empty (plain Redis) by default."""
    ha = {n for n, s in services.items() if "ha" in s.get("profiles", [])}
    assert ha == {"redis-replica-1", "redis-replica-2", "sentinel-1", "sentinel-2",
                  "sentinel-3"}
    assert "profiles" not in services["redis"]  # the primary of both shapes
    for node in ("redis-replica-1", "redis-replica-2"):
        cmd = services[node]["command"]
        assert cmd[cmd.index("--replicaof") + 1:][:2] == ["redis", "6379"]
    for node in ("redis", "redis-replica-1", "redis-replica-2"):
        cmd = services[node]["command"]
        for flag in ("--requirepass", "--masterauth", "--appendonly", "--min-replicas-to-write",
                     "--min-replicas-max-lag", "--replica-announce-ip"):
            assert flag in cmd, (node, flag)
        assert cmd[cmd.index("--replica-announce-ip") + 1] == node  # its DNS name
    script = services["sentinel-1"]["command"][0]
    assert "sentinel monitor $$MASTER redis 6379 2" in script  # quorum 2 of 3
    assert "sentinel resolve-hostnames yes" in script and "requirepass" in script
    for name in ("sentinel-2", "sentinel-3"):
        assert services[name]["command"] == services["sentinel-1"]["command"]
    vols = {services[n]["volumes"][0].split(":")[0] for n in ha | {"redis"}}
    assert len(vols) == 6  # each node and sentinel keeps its own data (a rewritten config)
    env = services["api"]["environment"]
    assert env["TOKENQ_REDIS_SENTINELS"] == "${TOKENQ_REDIS_SENTINELS:-}"
    assert env["TOKENQ_API__DURABLE_REPLICAS"] == "${TOKENQ_API__DURABLE_REPLICAS:-0}"
    assert env["TOKENQ_REDIS_MASTER_NAME"] == services["sentinel-1"]["environment"]["MASTER"]
    # The documented operator setting names exactly these sentinels.
    header = (COMPOSE / "compose.yml").read_text()
    m = re.search(r"TOKENQ_REDIS_SENTINELS=(\S+)", header)
    assert m is not None
    s = Settings(redis_url="redis://:pw@redis:6379/0", redis_sentinels=m[1].split(","))
    assert {a.split(":")[0] for a in s.redis_sentinels} == {"sentinel-1", "sentinel-2",
                                                            "sentinel-3"}
