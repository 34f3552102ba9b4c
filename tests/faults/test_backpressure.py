"""Backpressure and per-tenant limits: 429 with Retry-After; a deadline that passes in
the queue ends the job `expired` without running it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import FAKE, FAKE_IDLE, fake_stack, read_job, redis_of, wait_terminal
from tokenq.cli.stack import Stack
from tokenq.shared import keys

LIMITS = {
    "TOKENQ_API_KEYS": "ka:a,kb:b,kc:c,kr:r,kt:t,ks:s,kd:d",
    "TOKENQ_API__QUEUE_LIMIT": "5", "TOKENQ_API__TENANT_MAX_QUEUED": "3",
    "TOKENQ_API__RATE_LIMIT_RPS": "5", "TOKENQ_API__RATE_LIMIT_BURST": "5",
    "TOKENQ_API__TOKENS_PER_MIN": "300", "TOKENQ_API__MAX_STREAMS_PER_TENANT": "2",
}


@pytest.fixture(scope="module")
def limits_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with fake_stack(tmp_path_factory.mktemp("limits"), workers=1, slots=2, rate=20,
                    env=LIMITS) as st:
        yield st


def client(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"})


def post(c: httpx.Client, model: str = FAKE_IDLE, max_tokens: int = 2,
         **extra: object) -> httpx.Response:
    return c.post("/v1/jobs", json={"model": model, "prompt": "hi", "max_tokens": max_tokens,
                                    **extra})


def assert_429(resp: httpx.Response, code: str) -> None:
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == code
    assert int(resp.headers["Retry-After"]) >= 1


def test_tenant_and_queue_limits(limits_stack: Stack) -> None:
    with client(limits_stack, "ka") as a, client(limits_stack, "kb") as b, \
            client(limits_stack, "kc") as c:
        assert [post(a).status_code for _ in range(3)] == [202] * 3
        assert_429(post(a), "tenant_queue_full")  # a's own limit, queue not yet full
        assert [post(b).status_code for _ in range(2)] == [202] * 2
        assert_429(post(c), "queue_full")  # the model's queue holds 5
        r = redis_of(limits_stack)
        assert r.llen(keys.queue(FAKE_IDLE, "normal")) == 5
        first = r.zrange(keys.tenant_queued("a"), 0, 0)[0]
        assert a.delete(f"/v1/jobs/{first}").json()["status"] == "cancelled"
        assert r.zcard(keys.tenant_queued("a")) == 2  # a cancelled job no longer counts


def test_deadline_passed_in_queue_expires(limits_stack: Stack) -> None:
    r = redis_of(limits_stack)
    with client(limits_stack, "kd") as d:
        busy = [post(d, FAKE, 40).json()["id"] for _ in range(2)]  # both slots, 2 s each
        late = post(d, FAKE, 5, deadline=time.time() + 0.5).json()["id"]
        wait_terminal(r, [*busy, late], timeout=30)
    run = read_job(r, late)
    assert run.state == "expired" and run.attempts == 0 and not run.starts and not run.tokens
    assert run.terminal == ["error"]
    assert "deadline" in (r.hget(keys.job(late), "error") or "")


def test_requests_per_second_limit(limits_stack: Stack) -> None:
    with client(limits_stack, "kr") as rc, client(limits_stack, "kt") as other:
        codes = [rc.get("/v1/models").status_code for _ in range(12)]
        assert codes[:5] == [200] * 5 and 429 in codes[5:], codes
        resp = rc.get("/v1/models")
        assert_429(resp, "rate_limit_exceeded")
        assert other.get("/v1/models").status_code == 200  # buckets are per tenant
        time.sleep(1.2)  # 5/s refills
        assert rc.get("/v1/models").status_code == 200


def test_tokens_per_minute_limit(limits_stack: Stack) -> None:
    with client(limits_stack, "kt") as t:
        assert post(t, FAKE, 200).status_code == 202  # 201 of 300 tokens/min
        assert_429(post(t, FAKE, 200), "tokens_per_min_exceeded")
        assert_429(post(t, FAKE, 400), "tokens_per_min_exceeded")  # bigger than a minute


def test_open_streams_per_tenant(limits_stack: Stack) -> None:
    with client(limits_stack, "ks") as s:
        job_id = post(s, FAKE, 200).json()["id"]  # 10 s: its streams stay open
        path = f"/v1/jobs/{job_id}/events"
        streams = [s.stream("GET", path) for _ in range(2)]
        assert all(cm.__enter__().status_code == 200 for cm in streams)
        assert_429(s.get(path), "too_many_streams")
        for cm in streams:
            cm.__exit__(None, None, None)
        deadline = time.monotonic() + 5
        while True:  # closing them gives the slots back
            with s.stream("GET", path) as resp:
                if resp.status_code == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        s.delete(f"/v1/jobs/{job_id}")


def test_keys_file_with_hashed_keys(tmp_path: Path) -> None:
    from tokenq.api.auth import hash_key, load_keys_file

    path = tmp_path / "keys"
    path.write_text(f"# hashed keys\nsha256:{hash_key('s3cret')} acme\n"
                    f"{hash_key('root')} ops admin\n")
    keys_ = load_keys_file(path)
    assert keys_[hash_key("s3cret")].tenant == "acme" and not keys_[hash_key("s3cret")].admin
    assert keys_[hash_key("root")].admin and "s3cret" not in path.read_text()
