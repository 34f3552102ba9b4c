"""Redis Sentinel: every client tokenq builds follows a failover by itself, and durable
acceptance (TOKENQ_API__DURABLE_REPLICAS) answers 202 only once the replica has the job.

A real deployment on loopback per test (tests/faults/sentinel_deploy.py): a primary, one
replica, three sentinels; the primary is SIGKILLed as a dead host would be.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from tests.faults.harness import BASE_ENV, FAKE, check_exactly_once, wait_terminal
from tests.faults.sentinel_deploy import SentinelDeployment, sentinel_deployment, wait_for
from tokenq.api.app import create_app
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.redis_conn import async_client, sync_client
from tokenq.shared.settings_roles import ApiSettings


@pytest.fixture
def dep(tmp_path: Path) -> Iterator[SentinelDeployment]:
    with sentinel_deployment(tmp_path / "redis") as d:
        yield d


def models_file(tmp: Path) -> Path:
    path = tmp / "models.json"
    path.write_text(json.dumps({FAKE: {"backend": "fake", "n_parallel": 4,
                                       "fake_tokens_per_s": 200, "n_ctx": 65536}}))
    return path


def retrying() -> dict[str, object]:
    """The options the API and workers build their clients with (api/app.py)."""
    return {"decode_responses": True,
            "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
            "retry_on_error": [redis.ConnectionError, redis.TimeoutError]}


def test_factory_clients_use_the_sentinels_master(dep: SentinelDeployment) -> None:
    settings = dep.settings()
    c = sync_client(settings, decode_responses=True)
    try:
        c.set("tokenq:test:a", "1")
        assert c.connection_pool.connection_kwargs.get("db") == 0
        assert dep.master_port() == dep.primary.port
        assert dep.client_of(dep.primary).get("tokenq:test:a") == "1"
        assert c.wait(1, 5000) == 1
        assert dep.client_of(dep.replica).get("tokenq:test:a") == "1"
    finally:
        c.close()

    async def on_asyncio() -> str | None:
        a = async_client(settings, decode_responses=True)
        try:
            await a.set("tokenq:test:b", "2")
            got = await a.get("tokenq:test:b")
            return None if got is None else str(got)
        finally:
            await a.aclose()

    assert asyncio.run(on_asyncio()) == "2"


def test_clients_follow_a_failover_without_being_rebuilt(dep: SentinelDeployment) -> None:
    settings = dep.settings()
    c = sync_client(settings, **retrying())  # type: ignore[arg-type]

    async def scenario() -> tuple[float, float]:
        a = async_client(settings, **retrying())  # type: ignore[arg-type]
        try:
            await a.set("tokenq:test:before-async", "kept")
            c.set("tokenq:test:before", "kept")
            assert c.wait(1, 5000) == 1  # on the replica: the failover cannot lose it
            dep.primary.kill()
            killed = time.monotonic()
            sync_took = await asyncio.to_thread(
                wait_for, "a write through the same sync client after the failover",
                lambda: bool(c.set("tokenq:test:after", "1")), 90)
            while True:
                try:
                    await a.set("tokenq:test:after-async", "1")
                    break
                except redis.RedisError:
                    assert time.monotonic() - killed < 90, "asyncio client never wrote again"
                    await asyncio.sleep(0.05)
            return sync_took, time.monotonic() - killed
        finally:
            await a.aclose()

    old = dep.primary.port
    try:
        sync_took, async_took = asyncio.run(scenario())
        assert dep.master_port() == dep.replica.port != old
        assert c.get("tokenq:test:before") == "kept"
        assert c.get("tokenq:test:before-async") == "kept"
        new = dep.client_of(dep.replica)
        assert new.get("tokenq:test:after") == new.get("tokenq:test:after-async") == "1"
        assert new.info("replication")["role"] == "master"
        new.close()
    finally:
        c.close()
    print(f"\n[faults] Sentinel failover: clients built before the primary's SIGKILL wrote "
          f"again after {sync_took:.1f}s (sync) / {async_took:.1f}s (asyncio), not rebuilt "
          "(down-after 1 s; machine shared)")


def _post(client: TestClient, **headers: str) -> Any:
    return client.post("/v1/jobs", json={"model": FAKE, "prompt": "go", "max_tokens": 4},
                       headers=headers)


def test_durable_acceptance_waits_for_the_replica(dep: SentinelDeployment,
                                                  tmp_path: Path) -> None:
    timeout_ms = 500
    settings = dep.settings(state_dir=tmp_path, models_file=models_file(tmp_path),
                            served_models=[FAKE],
                            api=ApiSettings(durable_replicas=1, durable_timeout_ms=timeout_ms))
    replica = dep.client_of(dep.replica)
    with TestClient(create_app(settings)) as client:
        for _ in range(20):
            resp = _post(client)
            assert resp.status_code == 202, resp.text
            # The 202 came after WAIT: the replica has the record and its Celery message.
            job_id = resp.json()["id"]
            assert replica.hget(keys.job(job_id), "state") == "queued"
        # The replica dies (the primary stays): nothing can be made durable any more.
        dep.replica.kill()
        start = time.monotonic()
        resp = _post(client)
        took = time.monotonic() - start
        assert resp.status_code == 503, resp.text
        err = resp.json()["error"]
        assert err["code"] == "not_replicated" and err["type"] == "service_unavailable", err
        assert resp.headers["retry-after"] == "1"
        assert "cancelled" in err["message"], err
        assert took < 30, took  # bounded by the WAIT timeout (0.5 s), not a hang
        # With an Idempotency-Key the job is kept, named, and a retry answers that job.
        resp = _post(client, **{"Idempotency-Key": "k-1"})
        assert resp.status_code == 503, resp.text
        msg = resp.json()["error"]["message"]
        kept = msg.rsplit("/", 1)[1]
        assert kept.startswith("job_") and "Idempotency-Key" in msg, msg
        # Its retry is a 202 only once the job is on a replica: not while the replica is
        # down, then yes when it is back.
        again = _post(client, **{"Idempotency-Key": "k-1"})
        assert again.status_code == 503, again.text
        assert again.json()["error"]["code"] == "not_replicated"
        assert kept in again.json()["error"]["message"]
        dep.replica.start()
        dep.wait_replica_synced(dep.replica)
        again = _post(client, **{"Idempotency-Key": "k-1"})
        assert again.status_code == 202 and again.json()["id"] == kept, again.text
        replica.close()
        replica = dep.client_of(dep.replica)
        assert replica.hget(keys.job(kept), "state") == "queued"
    replica.close()
    print(f"\n[faults] durable acceptance: replica down -> 503 not_replicated in "
          f"{took * 1000:.0f} ms (WAIT timeout {timeout_ms} ms)")


def test_files_and_batches_wait_for_the_replica(dep: SentinelDeployment,
                                                tmp_path: Path) -> None:
    """An upload and a batch are answered, like a job, only once the replica has them; with
    the replica down each gets a 503 `not_replicated` and is withdrawn (no twin left
    behind by the client's retry)."""
    settings = dep.settings(state_dir=tmp_path, models_file=models_file(tmp_path),
                            served_models=[FAKE],
                            api=ApiSettings(durable_replicas=1, durable_timeout_ms=300))
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"model": FAKE, "prompt": "go", "max_tokens": 2}}) + "\n"

    def upload(client: TestClient) -> Any:
        return client.post("/v1/files", data={"purpose": "batch"},
                           files={"file": ("in.jsonl", line.encode())})

    def batch(client: TestClient, file_id: str) -> Any:
        return client.post("/v1/batches", json={"input_file_id": file_id,
                                                "endpoint": "/v1/completions",
                                                "completion_window": "24h"})

    replica = dep.client_of(dep.replica)
    with TestClient(create_app(settings)) as client:
        f = upload(client)
        assert f.status_code == 200, f.text
        file_id = f.json()["id"]
        assert replica.hget(keys.file(file_id), "id") == file_id
        b = batch(client, file_id)
        assert b.status_code == 200, b.text
        assert replica.hget(keys.batch(b.json()["id"]), "id") == b.json()["id"]
        dep.replica.kill()
        for resp in (upload(client), batch(client, file_id)):
            assert resp.status_code == 503, resp.text
            err = resp.json()["error"]
            assert err["code"] == "not_replicated" and "withdrawn" in err["message"], err
        # the uploads (the withdrawn batch's lines end cancelled: its error file is listed)
        uploads = client.get("/v1/files", params={"purpose": "batch"}).json()["data"]
        assert [x["id"] for x in uploads] == [file_id]
        statuses = {x["id"]: x["status"] for x in client.get("/v1/batches").json()["data"]}
        assert len(statuses) == 2, statuses
        assert next(s for i, s in statuses.items() if i != b.json()["id"]) in (
            "cancelling", "cancelled"), statuses
    replica.close()


def test_wait_cost_per_post(dep: SentinelDeployment, tmp_path: Path) -> None:
    """A figure, not a check: POST /v1/jobs latency with and without WAIT (in-process API,
    loopback replica). The two APIs take turns, POST by POST, so that the load of a shared
    machine falls on both alike; the printout is the only output."""
    mf = models_file(tmp_path)
    apps = [create_app(dep.settings(state_dir=tmp_path, models_file=mf, served_models=[FAKE],
                                    api=ApiSettings(durable_replicas=n, queue_limit=100_000)))
            for n in (0, 1)]
    times: list[list[float]] = [[], []]
    with TestClient(apps[0]) as plain, TestClient(apps[1]) as durable:
        for _ in range(200):
            for n, client in enumerate((plain, durable)):
                start = time.perf_counter()
                assert _post(client).status_code == 202
                times[n].append((time.perf_counter() - start) * 1000)
    diffs = sorted(b - a for a, b in zip(times[0], times[1], strict=True))
    p50 = [statistics.median(t) for t in times]
    p99 = [sorted(t)[197] for t in times]
    print(f"\n[faults] POST /v1/jobs p50/p99: {p50[0]:.2f}/{p99[0]:.2f} ms without WAIT, "
          f"{p50[1]:.2f}/{p99[1]:.2f} ms with WAIT 1; median paired difference "
          f"{statistics.median(diffs):+.2f} ms (loopback replica, 200 POSTs each)")


def test_stack_on_sentinel_survives_a_primary_kill(dep: SentinelDeployment,
                                                   tmp_path: Path) -> None:
    """API and worker processes (`tokenq up`'s) on the Sentinel deployment, durable
    acceptance on: a job, the primary SIGKILLed, then a second job. With one replica the
    promoted node has none left, so POSTs answer 503 `not_replicated` (never a 202 that a
    second failover could lose) until the dead node is back, as a replica; then the
    second job is accepted and completes."""
    settings = dep.settings(state_dir=tmp_path, models_file=models_file(tmp_path))
    st = Stack(settings, workers=1, models=[FAKE], quiet=True,
               drain_timeout_s=10,
               env={**BASE_ENV, "TOKENQ_API__DURABLE_REPLICAS": "1"})
    st.start_parts()
    r = sync_client(settings, **retrying())  # type: ignore[arg-type]
    try:
        st.wait_ready(models=[FAKE], timeout=120)
        with httpx.Client(base_url=st.url, timeout=30) as c:
            first = _accepted(c, 60)
            wait_terminal(r, [first], timeout=60)
            dep.primary.kill()
            killed = time.monotonic()
            promoted = wait_for("the replica promoted",
                                lambda: dep.master_port() == dep.replica.port, timeout=90)
            refused = wait_for("POST answered 503 not_replicated by the promoted node",
                               lambda: _refused_not_replicated(c), timeout=90)
            dep.primary.start()  # the dead host is back: sentinels make it a replica
            back = time.monotonic()
            second = _accepted(c, 120)
            accepted_after = time.monotonic() - back
            wait_terminal(r, [second], timeout=120)
            done_after = time.monotonic() - back
        check_exactly_once(r, [first, second], 8)
        assert dep.master_port() == dep.replica.port
        assert dep.client_of(dep.primary).info("replication")["role"] == "slave"
        assert all(p.poll() is None for _, p in st.worker_procs), "a worker exited"
        print(f"\n[faults] stack on Sentinel (durable 1), primary SIGKILLed: promoted after "
              f"{promoted:.1f}s, POSTs 503 not_replicated {refused + promoted:.1f}s after "
              f"the kill; old node back: a POST accepted {accepted_after:.1f}s later, "
              f"its job done {done_after:.1f}s after it came back "
              f"(total {time.monotonic() - killed:.1f}s; machine shared)")
    finally:
        r.close()
        st.stop()


def _refused_not_replicated(c: httpx.Client) -> bool:
    try:
        resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "go", "max_tokens": 8})
    except httpx.TransportError:
        return False
    assert resp.status_code in (202, 503), resp.text
    return resp.status_code == 503 and resp.json()["error"]["code"] == "not_replicated"


def _accepted(c: httpx.Client, timeout: float) -> str:
    """POST until 202 (a client retries the 503s of a failover), bounded."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "go", "max_tokens": 8})
            if resp.status_code == 202:
                return str(resp.json()["id"])
            assert resp.status_code == 503, resp.text
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "no 202 within the deadline"
        time.sleep(0.2)


def test_two_replicas_accept_again_after_a_failover(tmp_path: Path) -> None:
    """The topology durable acceptance wants: primary + 2 replicas. After the primary's
    SIGKILL the promoted node still has a replica to acknowledge, so POSTs are accepted
    again (202, durable) without anyone restarting the dead node."""
    with sentinel_deployment(tmp_path / "redis", replicas=2) as dep:
        settings = dep.settings(state_dir=tmp_path, models_file=models_file(tmp_path),
                                served_models=[FAKE],
                                api=ApiSettings(durable_replicas=1, durable_timeout_ms=500))
        with TestClient(create_app(settings)) as client:
            assert _post(client).status_code == 202
            dep.primary.kill()
            killed = time.monotonic()
            accepted = wait_for("a durable 202 after the failover",
                                lambda: _post(client).status_code == 202, timeout=120)
            job_id = _post(client).json()["id"]
        new_master = dep.master_port()
        assert new_master in (dep.nodes[1].port, dep.nodes[2].port)
        other = dep.nodes[2] if new_master == dep.nodes[1].port else dep.nodes[1]
        follower = dep.client_of(other)
        assert follower.hget(keys.job(job_id), "state") == "queued"  # WAIT saw it there
        follower.close()
    print(f"\n[faults] primary + 2 replicas, durable 1: POSTs accepted again {accepted:.1f}s "
          f"after the primary's SIGKILL ({time.monotonic() - killed:.1f}s to the end; "
          "machine shared)")
