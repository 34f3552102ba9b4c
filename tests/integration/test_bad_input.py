"""Everything the API cannot serve is a 4xx in OpenAI's envelope, and nothing is enqueued."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import NO_WORKER_MODEL, SMOL

MSG = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "The customer called about the invoice again. " * 400  # ~3,600 tokens > 2,048


def counts(r: redis.Redis) -> tuple[int, int]:
    jobs = sum(1 for k in r.scan_iter("tokenq:job:*") if k.count(":") == 2)
    queued = sum(int(r.llen(k)) for k in r.scan_iter("tokenq.*"))  # type: ignore[arg-type]
    return jobs, queued


@pytest.fixture
def nothing_enqueued(stack_redis: redis.Redis) -> Iterator[None]:
    before = counts(stack_redis)
    yield
    assert counts(stack_redis) == before


def assert_envelope(resp: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "code", "param"} and err["message"]
    if param is not None:
        assert err["param"] == param
    out: dict[str, Any] = err
    return out


BAD_BODIES: list[tuple[str, dict[str, Any], int, str | None]] = [
    ("missing model", {"messages": MSG}, 400, "model"),
    ("unknown model", {"model": "gpt-9", "messages": MSG}, 404, "model"),
    ("neither prompt nor messages", {"model": SMOL}, 400, None),
    ("both prompt and messages", {"model": SMOL, "prompt": "x", "messages": MSG}, 400, None),
    ("empty messages", {"model": SMOL, "messages": []}, 400, None),
    ("bad role", {"model": SMOL, "messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("temperature too high", {"model": SMOL, "prompt": "x", "temperature": 3}, 400,
     "temperature"),
    ("negative temperature", {"model": SMOL, "prompt": "x", "temperature": -1}, 400,
     "temperature"),
    ("top_p zero", {"model": SMOL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("top_k negative", {"model": SMOL, "prompt": "x", "top_k": -2}, 400, "top_k"),
    ("repetition_penalty zero", {"model": SMOL, "prompt": "x", "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("max_tokens zero", {"model": SMOL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens negative", {"model": SMOL, "prompt": "x", "max_tokens": -5}, 400,
     "max_tokens"),
    ("max_tokens beyond context", {"model": SMOL, "prompt": "x", "max_tokens": 4000}, 400,
     "max_tokens"),
    ("prompt longer than context", {"model": SMOL, "prompt": LONG_PROMPT}, 400, "prompt"),
    ("messages longer than context",
     {"model": SMOL, "messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, "messages"),
    ("bad priority", {"model": SMOL, "prompt": "x", "priority": "urgent"}, 400, "priority"),
    ("unknown field", {"model": SMOL, "prompt": "x", "temprature": 0.5}, 400, "temprature"),
    ("too many stops", {"model": SMOL, "prompt": "x", "stop": [str(i) for i in range(20)]}, 400,
     "stop"),
    ("empty stop", {"model": SMOL, "prompt": "x", "stop": [""]}, 400, "stop"),
    ("wrong type prompt", {"model": SMOL, "prompt": 42}, 400, "prompt"),
    ("metadata not strings", {"model": SMOL, "prompt": "x", "metadata": {"a": {"b": 1}}}, 400,
     None),
    ("image content part", {"model": SMOL, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     None),
]


@pytest.mark.parametrize(("name", "body", "status", "param"), BAD_BODIES,
                         ids=[b[0] for b in BAD_BODIES])
@pytest.mark.usefixtures("nothing_enqueued")
def test_bad_body(client: httpx.Client, name: str, body: dict[str, Any], status: int,
                  param: str | None) -> None:
    err = assert_envelope(client.post("/v1/jobs", json=body), status, param)
    if name == "prompt longer than context":
        assert err["code"] == "context_length_exceeded"


@pytest.mark.usefixtures("nothing_enqueued")
@pytest.mark.parametrize("raw", [b'{"model": "x", ', b'{"model": "\xff\xfe"}',
                                 b"[" * 5000 + b"]" * 5000])
def test_malformed_json(client: httpx.Client, raw: bytes) -> None:
    """Bytes that are not UTF-8 and nesting past the parser were code null, in FastAPI's
    own words."""
    resp = client.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert assert_envelope(resp, 400)["code"] == "invalid_json"


@pytest.mark.parametrize("ctype", [None, "application/x-www-form-urlencoded"])
def test_a_json_body_sent_untyped_is_read_as_json(client: httpx.Client,
                                                  ctype: str | None) -> None:
    """`curl -d '{...}'` without `-H 'content-type: application/json'` (what curl sends:
    form-urlencoded) is read as JSON, as llama-server and vLLM read it; it was a 400
    "Input should be a valid dictionary" on every route."""
    headers = {"content-type": ctype} if ctype else {}
    body = json.dumps({"model": NO_WORKER_MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    resp = client.post("/v1/jobs", content=body, headers=headers)
    assert resp.status_code == 202, resp.text
    client.post(f"/v1/jobs/{resp.json()['id']}/cancel")
    # what is not JSON stays refused, in the envelope
    assert_envelope(client.post("/v1/jobs", content=b"model=x&prompt=hi", headers={
        "content-type": "application/x-www-form-urlencoded"}), 400)


@pytest.mark.usefixtures("nothing_enqueued")
def test_body_over_limit_is_413(client: httpx.Client) -> None:
    big = {"model": SMOL, "prompt": "x" * 300_000}
    assert_envelope(client.post("/v1/jobs", json=big), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"model": "smollm2-135m-instruct", "prompt": "'
        for _ in range(300):
            yield b"x" * 1000
        yield b'"}'

    assert_envelope(client.post("/v1/jobs", content=chunks(),
                                headers={"content-type": "application/json"}), 413)


def test_unknown_job_is_404(client: httpx.Client) -> None:
    for method, path in [("GET", "/v1/jobs/job_nope"), ("DELETE", "/v1/jobs/job_nope"),
                         ("GET", "/v1/jobs/job_nope/events"), ("GET", "/v1/nowhere")]:
        assert_envelope(client.request(method, path), 404)


def test_an_id_of_another_shape_is_404(client: httpx.Client) -> None:
    """An id goes into a Redis key name: `<job id>:events` named the job's stream, a key
    of another type, and Redis's WRONGTYPE came back as a retryable 503 (and told another
    tenant that the id exists)."""
    job_id = client.post("/v1/jobs", json={"model": NO_WORKER_MODEL, "prompt": "Hi",
                                           "max_tokens": 2}).json()["id"]
    file_id = client.post("/v1/files", data={"purpose": "batch"},
                          files={"file": ("x.jsonl", b"{}\n")}).json()["id"]
    for method, path in [("GET", f"/v1/jobs/{job_id}:events"),
                         ("DELETE", f"/v1/jobs/{job_id}:events"),
                         ("GET", f"/v1/jobs/{job_id}:events/events"),
                         ("GET", f"/v1/files/{file_id}:data"),
                         ("GET", f"/v1/files/{file_id}:data/content"),
                         ("GET", "/v1/batches/batch_" + "0" * 32 + ":out"),
                         ("POST", "/v1/batches/batch_" + "0" * 32 + ":out/cancel")]:
        assert_envelope(client.request(method, path), 404)
    client.delete(f"/v1/jobs/{job_id}")
    client.delete(f"/v1/files/{file_id}")


def test_bad_last_event_id(client: httpx.Client) -> None:
    body = {"model": SMOL, "prompt": "Hi", "max_tokens": 2}
    job_id = client.post("/v1/jobs", json=body).json()["id"]
    resp = client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "not-an-id"})
    assert_envelope(resp, 400, "last_event_id")
