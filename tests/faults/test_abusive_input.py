"""Malformed and abusive requests: every one a 4xx in OpenAI's envelope, none enqueued.
(tests/integration/test_bad_input.py has 27 more on the real models.)"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE
from tokenq.cli.stack import Stack

OK = {"model": FAKE, "prompt": "hi", "max_tokens": 2}


def counts(r: redis.Redis) -> tuple[int, int]:
    jobs = sum(1 for k in r.scan_iter("tokenq:job:*", count=1000) if k.count(":") == 2)
    queued = sum(int(r.llen(k)) for k in r.scan_iter("tokenq.*"))  # type: ignore[arg-type]
    return jobs, queued


@pytest.fixture
def nothing_enqueued(secure_redis: redis.Redis) -> Iterator[None]:
    before = counts(secure_redis)
    yield
    assert counts(secure_redis) == before


def assert_envelope(resp: httpx.Response, status: int) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "code", "param"} and err["message"], err


JSON = {"content-type": "application/json"}
RAW: list[tuple[str, bytes, dict[str, str], int]] = [
    ("array body", b"[1, 2]", JSON, 400),
    ("null body", b"null", JSON, 400),
    ("string body", b'"model"', JSON, 400),
    ("empty body", b"", JSON, 400),
    ("not JSON", b"model=fake&prompt=hi", JSON, 400),
    ("form encoded", b"model=fake&prompt=hi",
     {"content-type": "application/x-www-form-urlencoded"}, 400),
    ("invalid UTF-8", b'{"model": "fake", "prompt": "\xff\xfe"}', JSON, 400),
    ("deeply nested", b'{"model": "fake", "prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
     JSON, 400),
    ("NaN temperature", b'{"model": "fake", "prompt": "x", "temperature": NaN}', JSON, 400),
    ("infinite temperature", b'{"model": "fake", "prompt": "x", "temperature": 1e999}', JSON,
     400),
    ("truncated JSON", b'{"model": "fake", "prompt": "x', JSON, 400),
]

BODIES: list[tuple[str, dict[str, Any], int]] = [
    ("max_tokens 1e30", {**OK, "max_tokens": 10**30}, 400),
    ("max_tokens word", {**OK, "max_tokens": "ten"}, 400),
    ("max_tokens over limit", {**OK, "max_tokens": 5000}, 400),
    ("seed over 64 bits", {**OK, "seed": 2**70}, 400),
    ("temperature word", {**OK, "temperature": "hot"}, 400),
    ("top_k fraction", {**OK, "top_k": 1.5}, 400),
    ("stop string too long", {**OK, "stop": ["x" * 65]}, 400),
    ("a thousand stops", {**OK, "stop": ["s"] * 1000}, 400),
    ("metadata 1,000 keys", {**OK, "metadata": {f"k{i}": "v" for i in range(1000)}}, 400),
    ("metadata value 10 kB", {**OK, "metadata": {"k": "v" * 10_000}}, 400),
    ("model path traversal", {**OK, "model": "../../etc/passwd"}, 404),
    ("model 10 kB name", {**OK, "model": "m" * 10_000}, 404),
    ("priority number", {**OK, "priority": 1}, 400),
    ("response_format unknown", {**OK, "response_format": {"type": "yaml"}}, 400),
    ("message content number", {"model": FAKE, "messages": [{"role": "user", "content": 7}]},
     400),
    ("message without role", {"model": FAKE, "messages": [{"content": "hi"}]}, 400),
    ("negative deadline", {**OK, "deadline": -5}, 400),
    ("prompt list of ints", {**OK, "prompt": [1, 2, 3]}, 400),
]


@pytest.mark.usefixtures("nothing_enqueued")
@pytest.mark.parametrize(("raw", "headers", "status"), [c[1:] for c in RAW],
                         ids=[c[0] for c in RAW])
def test_raw_body(alpha: httpx.Client, raw: bytes, headers: dict[str, str],
                  status: int) -> None:
    assert_envelope(alpha.post("/v1/jobs", content=raw, headers=headers), status)


@pytest.mark.usefixtures("nothing_enqueued")
@pytest.mark.parametrize(("body", "status"), [c[1:] for c in BODIES],
                         ids=[c[0] for c in BODIES])
def test_bad_body(alpha: httpx.Client, body: dict[str, Any], status: int) -> None:
    assert_envelope(alpha.post("/v1/jobs", json=body), status)


@pytest.mark.usefixtures("nothing_enqueued")
def test_bodies_over_the_limit_are_413(alpha: httpx.Client) -> None:
    assert_envelope(alpha.post("/v1/jobs", json={**OK, "prompt": "x" * 300_000}), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"model": "fake", "prompt": "'
        for _ in range(300):
            yield b"x" * 1000
        yield b'"}'

    assert_envelope(alpha.post("/v1/jobs", content=chunks(), headers=JSON), 413)


@pytest.mark.usefixtures("nothing_enqueued")
def test_slow_body_is_cut_off(secure_stack: Stack) -> None:
    """A client that trickles its body is answered 408 after the 2 s body timeout."""
    with socket.create_connection(("127.0.0.1", secure_stack.port), timeout=10) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEYS["alpha"].encode() +
                  b"\r\nContent-Length: 100\r\n\r\n{\"model\"")
        t0 = time.monotonic()
        reply = s.recv(4096)
        waited = time.monotonic() - t0
        while b'"request_timeout"' not in reply and (more := s.recv(4096)):
            reply += more  # the body may come in a second segment
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"request_timeout"' in reply and 1.5 < waited < 6, waited


@pytest.mark.usefixtures("nothing_enqueued")
@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/jobs/..%2F..%2Fetc%2Fpasswd", 404),
    ("GET", "/v1/jobs/" + "j" * 5000, 404),
    ("GET", "/v1/jobs/job_*", 404),  # no key pattern reaches Redis
    ("DELETE", "/v1/jobs/job_00000000000000000000000000000000", 404),
    ("GET", "/v1/jobs/job_nope/events?last_event_id=0-0;DROP", 404),
    ("PUT", "/v1/jobs", 405),
    ("GET", "/v1/nowhere", 404),
])
def test_bad_paths(alpha: httpx.Client, method: str, path: str, status: int) -> None:
    assert_envelope(alpha.request(method, path), status)


def test_bad_stream_parameters(alpha: httpx.Client, secure_redis: redis.Redis) -> None:
    job_id = alpha.post("/v1/jobs", json=OK).json()["id"]  # a real job to aim at
    before = counts(secure_redis)
    assert_envelope(alpha.get(f"/v1/jobs/{job_id}/events",
                              headers={"Last-Event-ID": "not-an-id"}), 400)
    assert_envelope(alpha.get(f"/v1/jobs/{job_id}/events?last_event_id=1-0;x"), 400)
    assert_envelope(alpha.get(f"/v1/jobs/{job_id}/events?cancel_on_disconnect=maybe"), 400)
    assert_envelope(alpha.get(f"/v1/jobs/{job_id}",
                              headers={"Authorization": "Bearer " + "k" * 10_000}), 401)
    assert counts(secure_redis) == before
