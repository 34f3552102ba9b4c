"""compose/k8s/: no cluster runs here, so every manifest is validated offline: built-in
objects against the Kubernetes API's own JSON schemas (the kubernetes-validate package ships
them; strict: unknown fields fail), the KEDA ScaledObject against KEDA's CRD schema
(cloudcoil-models-keda; strict the same way) and a schema of the fields tokenq relies on,
then the cross-references: probes, drain budgets, selectors, secrets, the scaling query."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import typer
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject

from tests.unit.promql import check
from tokenq.cli.main import app as cli_app
from tokenq.shared.settings import ModelConfig, Settings, default_models, variable_names

K8S = Path(__file__).resolve().parents[2] / "compose" / "k8s"
K8S_VERSION = "1.30"  # the oldest Kubernetes these manifests are meant for

SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"],
            "properties": {
                "scaleTargetRef": {"type": "object", "required": ["name"],
                                   "properties": {"name": {"type": "string"}}},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "triggers": {
                    # one trigger: HPA takes the max over triggers, and we want the sum
                    "type": "array", "minItems": 1, "maxItems": 1,
                    "items": {
                        "type": "object", "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "prometheus"},
                            "metadata": {
                                "type": "object",
                                "required": ["serverAddress", "query", "threshold"],
                                # KEDA reads trigger metadata as strings only
                                "additionalProperties": {"type": "string"},
                                "properties": {
                                    "serverAddress": {"pattern": "^https?://"},
                                    "threshold": {"pattern": r"^\d+$"},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def documents() -> list[dict[str, Any]]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    return [d for f in sorted(listed) for d in yaml.safe_load_all((K8S / f).read_text()) if d]


@pytest.fixture(scope="module")
def docs() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents()}


def of_kind(docs: dict[tuple[str, str], dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for (k, _), d in docs.items() if k == kind]


def test_every_object_is_valid_against_its_schema(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    for (kind, name), doc in docs.items():
        if kind == "ScaledObject":
            jsonschema.validate(doc, SCALED_OBJECT)
            strict_keda(doc)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tokenq", name


def strict_keda(doc: dict[str, Any]) -> None:
    """KEDA's own ScaledObject schema (models generated from its CRD, cloudcoil-models-keda),
    strict: a field the CRD does not know is dropped by the parse, and that is an error."""
    parsed = ScaledObject.model_validate(doc).model_dump(by_alias=True, exclude_unset=True,
                                                         mode="json")

    def unknown(given: Any, kept: Any, path: str) -> list[str]:
        if isinstance(given, dict) and isinstance(kept, dict):
            return [p for k, v in given.items()
                    for p in ([f"{path}.{k}"] if k not in kept else unknown(v, kept[k],
                                                                            f"{path}.{k}"))]
        if isinstance(given, list) and isinstance(kept, list):
            return [p for i, (g, k) in enumerate(zip(given, kept, strict=True))
                    for p in unknown(g, k, f"{path}[{i}]")]
        return []
    assert not unknown(doc, parsed, ""), unknown(doc, parsed, "")


def test_keda_validation_refuses_unknown_fields_and_bad_types(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    [so, *_] = of_kind(docs, "ScaledObject")
    with pytest.raises(AssertionError, match="pollingIntervall"):
        strict_keda({**so, "spec": {**so["spec"], "pollingIntervall": 5}})
    with pytest.raises(pydantic.ValidationError):
        strict_keda({**so, "spec": {**so["spec"], "minReplicaCount": "zero"}})


def test_api_keys_come_from_a_secret_and_prometheus_is_shipped(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    spec, c = pod(docs[("Deployment", "tokenq-api")])
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    keys_file = env["TOKENQ_API__KEYS_FILE"]
    [vol] = [n for n, path in mounts.items() if keys_file.startswith(path + "/")]
    assert secrets[vol] == "tokenq-api-keys"
    # KEDA's triggers query the Prometheus these manifests ship, not one assumed elsewhere
    svc = docs[("Service", "tokenq-prometheus")]
    for so in of_kind(docs, "ScaledObject"):
        [trigger] = so["spec"]["triggers"]
        host = trigger["metadata"]["serverAddress"].split("//")[1].split(".")[0]
        assert host == svc["metadata"]["name"]
    prom_cfg = yaml.safe_load(docs[("ConfigMap", "tokenq-prometheus")]["data"]["prometheus.yml"])
    jobs = {j["job_name"]: j for j in prom_cfg["scrape_configs"]}
    [dns] = jobs["tokenq-api"]["dns_sd_configs"]
    assert docs[("Service", dns["names"][0])]["spec"]["clusterIP"] == "None"
    [sd] = jobs["tokenq-workers"]["http_sd_configs"]
    _, prom = pod(docs[("Deployment", "tokenq-prometheus")])
    key_dir = sd["authorization"]["credentials_file"].rsplit("/", 1)[0]
    assert key_dir in {m["mountPath"] for m in prom["volumeMounts"]}


def config(docs: dict[tuple[str, str], dict[str, Any]]) -> Settings:
    data = docs[("ConfigMap", "tokenq-config")]["data"]
    assert set(data) <= variable_names()  # a misspelt variable would be ignored silently
    env: dict[str, Any] = {}
    for var, value in data.items():  # TOKENQ_WORKER__DRAIN_GRACE_S: worker.drain_grace_s
        name, _, field = var.removeprefix("TOKENQ_").lower().partition("__")
        if field:
            env.setdefault(name, {})[field] = value
        else:
            env[name] = value
    env["served_models"] = json.loads(env["served_models"])
    return Settings(redis_url="redis://:pw@redis:6379/0", **env)


def pod(deploy: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = deploy["spec"]["template"]["spec"]
    [container] = spec["containers"]
    return spec, container


def test_api_probes_prestop_and_grace_cover_the_drain(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    s = config(docs)
    spec, c = pod(docs[("Deployment", "tokenq-api")])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"]["path"].startswith("/ready")
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    assert str(ports["http"]) == c["command"][c["command"].index("--port") + 1]
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + s.api.drain_s
    svc = docs[("Service", "tokenq-api")]["spec"]
    labels = docs[("Deployment", "tokenq-api")]["spec"]["template"]["metadata"]["labels"]
    assert svc["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in svc["ports"]} <= set(ports)


def test_workers_probe_metrics_and_grace_covers_the_drain(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    s = config(docs)
    group = typer.main.get_command(cli_app)
    for deploy in of_kind(docs, "Deployment"):
        spec, c = pod(deploy)
        if c.get("command", ["", ""])[1] != "worker":
            continue
        group.get_command(None, "worker").make_context(  # type: ignore[attr-defined]
            "worker", list(c["command"][2:]))
        assert spec["terminationGracePeriodSeconds"] > s.worker.drain_grace_s
        assert {p["containerPort"] for p in c["ports"]} == {s.worker.metrics_port}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] == "metrics"
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["TOKENQ_WORKER__METRICS_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] \
            == "status.podIP"


def test_gpu_worker_gets_a_gpu(docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    _, c = pod(docs[("Deployment", "tokenq-worker-qwen")])
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_catalogue_pools_follow_their_backends_models(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    """A CPU and a GPU pool that follow the catalogue: `tokenq autoscale --catalogue-only
    --backend ...` (a command the CLI takes), each worker on its own metrics port, the GPU
    pool with its GPU, both drained within their grace."""
    group = typer.main.get_command(cli_app)
    for name, backend in (("tokenq-pool-cpu", "llama"), ("tokenq-pool-gpu", "vllm")):
        spec, c = pod(docs[("Deployment", name)])
        cmd = c["command"]
        assert cmd[:3] == ["tokenq", "autoscale", "--catalogue-only"], cmd
        assert cmd[cmd.index("--backend") + 1] == backend
        group.get_command(None, "autoscale").make_context(  # type: ignore[attr-defined]
            "autoscale", list(cmd[2:]))
        env = {e["name"]: e for e in c["env"]}
        assert env["TOKENQ_WORKER__METRICS_PORT"]["value"] == "0"
        assert spec["terminationGracePeriodSeconds"] > config(docs).worker.drain_grace_s
        assert ("nvidia.com/gpu" in c["resources"]["limits"]) == (backend == "vllm")


def test_scaled_objects_scale_each_worker_on_its_models_backlog(
        docs: dict[tuple[str, str], dict[str, Any]]) -> None:
    served = config(docs).served_models
    registry = default_models()
    models_json = json.loads(docs[("ConfigMap", "tokenq-models")]["data"]["models.json"])
    compose_models = json.loads((K8S.parent / "models.json").read_text())
    assert models_json == compose_models  # one registry for compose and k8s
    registry.update({k: ModelConfig.model_validate(v) for k, v in models_json.items()})
    assert set(served) <= set(registry)
    scaled = of_kind(docs, "ScaledObject")
    workers = [d for d in of_kind(docs, "Deployment")
               if pod(d)[1].get("command", ["", ""])[1] == "worker"]
    assert {so["spec"]["scaleTargetRef"]["name"] for so in scaled} \
        == {d["metadata"]["name"] for d in workers}
    for so in scaled:
        deploy = docs[("Deployment", so["spec"]["scaleTargetRef"]["name"])]
        cmd = pod(deploy)[1]["command"]
        model = cmd[cmd.index("--model") + 1]
        [trigger] = so["spec"]["triggers"]
        query = trigger["metadata"]["query"]
        assert check(query) == {"tokenq_queue_depth", "tokenq_num_requests_running"}
        assert set(re.findall(r'model="([^"]+)"', query)) == {model}
        # threshold = the model's slots per worker: ceil(backlog / slots) as tokenq autoscale
        cfg = registry[model]
        slots = cfg.max_num_seqs if cfg.backend == "vllm" else cfg.n_parallel
        assert int(trigger["metadata"]["threshold"]) == slots
        assert so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kustomize_builds_every_object_into_the_namespace() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    built = [d for d in yaml.safe_load_all(out) if d]
    assert {(d["kind"], d["metadata"]["name"]) for d in built} \
        == {(d["kind"], d["metadata"]["name"]) for d in documents()}
    assert {d["metadata"]["namespace"] for d in built} == {"tokenq"}
