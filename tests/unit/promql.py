"""PromQL checks shared by the compose and k8s tests: parse with Prometheus' own grammar
(promql-parser), and check every metric and grouping label against shared/metrics.py."""

from __future__ import annotations

import promql_parser as pq
from prometheus_client.metrics import MetricWrapperBase

from tokenq.shared.metrics import ClusterMetrics, WorkerMetrics

# Labels Prometheus adds (job, instance) or our scrape config adds (worker, backend).
TARGET_LABELS = {"job", "instance", "worker", "backend"}


def exported() -> dict[str, set[str]]:
    """Every series name tokenq exports -> its labels (histograms: _bucket has `le`)."""
    out: dict[str, set[str]] = {}
    for holder in (ClusterMetrics(), WorkerMetrics()):
        for metric in vars(holder).values():
            if not isinstance(metric, MetricWrapperBase):
                continue
            name, kind = metric._name, metric._type
            labels = set(metric._labelnames)
            if kind == "counter":
                out[f"{name}_total"] = labels
            elif kind == "histogram":
                out[f"{name}_bucket"] = labels | {"le"}
                out[f"{name}_count"] = out[f"{name}_sum"] = labels
            else:
                out[name] = out.get(name, set()) | labels
    return out


def check(expr: str) -> set[str]:
    """Parse `expr` (Grafana variables replaced) and return the metrics it reads; raise
    AssertionError for an unknown tokenq metric or a grouping label no input carries."""
    text = expr.replace("$__rate_interval", "1m").replace("$model", ".*")
    tree = pq.parse(text)  # raises ValueError on a syntax error
    known = exported()
    metrics: set[str] = set()
    groupings: list[set[str]] = []

    def visit(node: object) -> None:
        if isinstance(node, pq.VectorSelector) and node.name:
            metrics.add(node.name)
        if isinstance(node, pq.AggregateExpr) and node.modifier is not None:
            groupings.append(set(node.modifier.labels))

    pq.walk(tree, visit)
    for name in metrics:
        assert name in known or name == "up", f"{name} is not exported by tokenq ({expr})"
    labels = set().union(*(known.get(m, set()) for m in metrics)) | TARGET_LABELS
    for group in groupings:
        assert group <= labels, f"grouping by {group - labels} that no input has ({expr})"
    return metrics
