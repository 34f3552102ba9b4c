"""The Grafana dashboard's PromQL against a live stack, scraped by a real Prometheus.

    apt-get install prometheus        # Debian's package: the binary only is used, not its service
    .venv/bin/python benchmarks/prometheus_dashboard.py [--model smollm2-135m-instruct]

Where no Docker engine runs (so `docker compose up` and Grafana cannot), this is the
closest check of what an operator would see: it starts the embedded stack (Redis, API,
one CPU worker) and a Prometheus with compose/prometheus/prometheus.yml (its `api:8000`
pointed at this API, the same HTTP service discovery for workers, the same alert rules),
then drives load with `tokenq bench run` at concurrency 4 and 16 (16 is twice the worker's
slots, so jobs wait in the queue), and finally evaluates every expression of the
dashboard (compose/grafana/dashboards/*.json) over the run. It prints, per panel
expression, the series count and the max before / during the load, and fails (exit 1)
if an expression returns nothing or the queue, running jobs and token rate did not move.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenq.cli.stack import Stack  # noqa: E402
from tokenq.shared.redis_server import die_with_parent, free_port  # noqa: E402
from tokenq.shared.settings import Settings  # noqa: E402

COMPOSE = ROOT / "compose"
RATE_WINDOW = "20s"  # what Grafana's $__rate_interval is at a 2 s scrape and a short range
MUST_MOVE = ("tokenq_queue_depth", "tokenq_num_requests_running",
             "tokenq_generation_tokens_total")


def prometheus_config(api: str, scrape_s: float) -> str:
    """compose's scrape config pointed at the embedded stack: its one API process instead of
    the `api` replicas (DNS) and the load balancer, and no key (the embedded API has none)."""
    doc = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    doc["global"]["scrape_interval"] = f"{scrape_s:g}s"
    doc["rule_files"] = [str(COMPOSE / "prometheus" / "alerts.yml")]
    for job in doc["scrape_configs"]:
        if job.pop("dns_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": [api]}]
        for sd in job.get("http_sd_configs", []):
            sd["url"] = sd["url"].replace("lb:8000", api)
            sd.pop("authorization", None)
    return str(yaml.safe_dump(doc, sort_keys=False))


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []
    for path in sorted((COMPOSE / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    expr = target["expr"].replace('"$model"', '".*"')
                    out.append((panel["title"], expr.replace("$__rate_interval", RATE_WINDOW)))
    return out


def query_range(prom: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    r = httpx.get(f"{prom}/api/v1/query_range",
                  params={"query": expr, "start": start, "end": end, "step": "2s"}, timeout=30)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def peak(series: list[dict[str, Any]], start: float, end: float) -> float:
    vals = [float(v) for s in series for t, v in s["values"]
            if start <= float(t) <= end and not math.isnan(float(v))]
    return max(vals) if vals else float("nan")


def wait_targets(prom: str, want: int, timeout: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    active: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{prom}/api/v1/targets", timeout=5)
            active = r.json()["data"]["activeTargets"]
        except httpx.HTTPError:  # not listening yet
            time.sleep(0.5)
            continue
        if len(active) >= want and all(t["health"] == "up" for t in active):
            return active
        time.sleep(1)
    raise TimeoutError(f"Prometheus targets not all up: {active}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--scrape-s", type=float, default=2.0)
    args = ap.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        print("prometheus is not on PATH (Debian: apt-get install prometheus)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="prom-check-", dir=ROOT / ".tokenq"))
    settings = Settings(state_dir=tmp / "state")
    model = args.model or settings.default_model
    stack = Stack(settings, workers=1, models=[model], quiet=True)
    prom_port = free_port()
    prom = f"http://127.0.0.1:{prom_port}"
    proc: subprocess.Popen[bytes] | None = None
    try:
        stack.start()
        stack.wait_ready()
        (tmp / "prometheus.yml").write_text(
            prometheus_config(f"127.0.0.1:{stack.port}", args.scrape_s))
        with open(tmp / "prometheus.log", "wb") as log:  # the child keeps its own handle
            proc = subprocess.Popen(
                [binary, f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        targets = wait_targets(prom, want=2)
        print(f"Prometheus {prom}: {len(targets)} targets up "
              f"({', '.join(sorted(t['labels']['job'] for t in targets))})")
        rules = httpx.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
        loaded = [r for g in rules for r in g["rules"]]
        bad = [r["name"] for r in loaded if r.get("health") not in ("ok", "unknown")]
        print(f"alert rules loaded: {len(loaded)}, unhealthy: {bad or 'none'}")
        time.sleep(3 * args.scrape_s)
        t0 = time.time()  # idle before it, load after it
        bench = subprocess.run(
            [sys.executable, "-m", "tokenq.cli.main", "bench", "run", "--url", stack.url,
             "--model", model, "--concurrency", "4,16", "--max-tokens", "48",
             "--prompt-words", "60"],
            capture_output=True, text=True, cwd=ROOT)
        t1 = time.time()
        print(f"tokenq bench (c=4, then c=16 on 8 slots): {t1 - t0:.0f} s, rc {bench.returncode}")
        time.sleep(3 * args.scrape_s)
        failures = []
        print(f"\n{'panel':<32} {'series':>6} {'idle max':>10} {'load max':>10}  expression")
        for title, expr in dashboard_exprs():
            series = query_range(prom, expr, t0 - 30, time.time())
            idle, load = peak(series, t0 - 30, t0), peak(series, t0, t1 + 2 * args.scrape_s)
            print(f"{title[:32]:<32} {len(series):>6} {idle:>10.3g} {load:>10.3g}  {expr[:90]}")
            if not series or math.isnan(load):
                failures.append(f"no data: {expr}")
            elif any(m in expr for m in MUST_MOVE) and not load > 0:
                failures.append(f"did not move under load: {expr}")
        if bench.returncode != 0:
            failures.append(f"bench failed: {bench.stderr[-2000:]}")
        print("\n" + ("\n".join(failures) if failures else "every panel has data; queue depth, "
                                                           "running jobs and token rate moved"))
        return 1 if failures else 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
