"""Hostile tenant, resource exhaustion (issue 17 item 6): file quotas per tenant, rate
limits on in production, bounded metadata and seeds, deep schemas refused, a response
schema stored once. Each refusal a 4xx in OpenAI's envelope; the other tenant unaffected."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from tests.faults.harness import FAKE, submit, wait_terminal
from tests.faults.hostile import MAX_FILE_BYTES, MAX_FILES, client, hostile, hredis
from tests.faults.test_abusive_input import assert_envelope
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.settings import Settings

__all__ = ["hostile", "hredis"]  # fixtures, used by name

CHAT = {"model": FAKE, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": FAKE, "max_tokens": 2, "prompt": "hi"}
JOB = {"model": FAKE, "max_tokens": 2, "prompt": "hi"}


def upload(c: Any, size: int) -> Any:
    return c.post("/v1/files", data={"purpose": "user_data"},
                  files={"file": ("f.txt", b"x" * size)})


def test_an_upload_with_two_file_parts_is_refused(hostile: Stack) -> None:
    """Two `file` (or `purpose`) parts: a 400 naming it, nothing stored (not the last part
    kept silently, which a client sending the wrong one first would never see)."""
    with client(hostile, "alpha") as alpha:
        before = len(alpha.get("/v1/files").json()["data"])
        two_files = [("file", ("a.txt", b"a")), ("file", ("b.txt", b"b"))]
        resp = alpha.post("/v1/files", data={"purpose": "user_data"}, files=two_files)
        assert_envelope(resp, 400)
        assert resp.json()["error"]["param"] == "file"
        resp = alpha.post("/v1/files", data={"purpose": ["user_data", "batch"]},
                          files={"file": ("a.txt", b"a")})
        assert_envelope(resp, 400)
        assert resp.json()["error"]["param"] == "purpose"
        assert len(alpha.get("/v1/files").json()["data"]) == before


def test_file_quota_per_tenant(hostile: Stack) -> None:
    with client(hostile, "alpha") as alpha, client(hostile, "beta") as beta:
        for f in alpha.get("/v1/files").json()["data"]:
            alpha.delete(f"/v1/files/{f['id']}")
        ids = []
        for _ in range(MAX_FILES):
            resp = upload(alpha, 10)
            assert resp.status_code == 200, resp.text
            ids.append(resp.json()["id"])
        resp = upload(alpha, 10)
        assert_envelope(resp, 403)
        assert resp.json()["error"]["code"] == "quota_exceeded"
        beta_file = upload(beta, 10)  # the other tenant's quota is its own
        assert beta_file.status_code == 200
        beta.delete(f"/v1/files/{beta_file.json()['id']}")
        alpha.delete(f"/v1/files/{ids.pop()}")
        big = upload(alpha, MAX_FILE_BYTES - 20)  # 20 bytes held: this one fits exactly
        assert big.status_code == 200, big.text
        ids.append(big.json()["id"])
        alpha.delete(f"/v1/files/{ids.pop(0)}")
        over = upload(alpha, 11)  # a file slot is free; the bytes are not
        assert_envelope(over, 403)
        assert "bytes" in over.json()["error"]["message"]
        assert len(alpha.get("/v1/files").json()["data"]) == 2  # the refused one left nothing
        for file_id in ids:
            alpha.delete(f"/v1/files/{file_id}")
        assert upload(alpha, 100).status_code == 200


def test_rate_limits_on_by_default_in_production(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "redis://:pw@redis.internal:6379/0"
    prod = Settings(env="production", redis_url=url)
    assert prod.api.rate_limit_rps == prod.api.production_rate_limit_rps > 0
    assert prod.api.tokens_per_min == prod.api.production_tokens_per_min > 0
    off = Settings(env="production", redis_url=url, api={"rate_limit_rps": 0, "tokens_per_min": 0})
    assert off.api.rate_limit_rps == 0 and off.api.tokens_per_min == 0  # the operator's choice
    dev = Settings()
    assert dev.api.rate_limit_rps == 0 and dev.api.tokens_per_min == 0
    monkeypatch.setenv("TOKENQ_API__RATE_LIMIT_RPS", "0")  # set as a variable: still the choice
    from_env = Settings(env="production", redis_url=url)
    assert from_env.api.rate_limit_rps == 0 and from_env.api.tokens_per_min > 0


META_17 = {f"k{i}": "v" for i in range(17)}
META_LONG_KEY = {"k" * 65: "v"}
META_LONG_VALUE = {"k": "v" * 513}


def nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


BAD: list[tuple[str, str, dict[str, Any]]] = [
    *[(route, f"metadata {name}", {**body, "metadata": meta})
      for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
                          ("/v1/jobs", JOB))
      for name, meta in (("17 pairs", META_17), ("key 65", META_LONG_KEY),
                         ("value 513", META_LONG_VALUE))],
    *[(route, f"seed {seed}", {**body, "seed": seed})
      for route, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
                          ("/v1/jobs", JOB))
      for seed in (2**64, -(2**63) - 1, 10**40)],
    *[(route, f"schema depth {d}", {**body, "response_format": fmt(nested_schema(d))})
      for route, body in (("/v1/chat/completions", CHAT), ("/v1/jobs", JOB))
      for d in (40, 100, 400)],
]


@pytest.mark.parametrize(("route", "body"), [(r, b) for r, _, b in BAD],
                         ids=[f"{r} {n}" for r, n, _ in BAD])
def test_over_limit_fields_are_400(hostile: Stack, route: str, body: dict[str, Any]) -> None:
    with client(hostile, "alpha") as alpha:
        assert_envelope(alpha.post(route, json=body), 400)


def test_batch_metadata_bounded(hostile: Stack) -> None:
    with client(hostile, "alpha") as alpha:
        for meta in (META_17, META_LONG_KEY, META_LONG_VALUE):
            resp = alpha.post("/v1/batches", json={"input_file_id": "file-x",
                                                   "endpoint": "/v1/chat/completions",
                                                   "metadata": meta})
            assert_envelope(resp, 400)


def test_response_schema_stored_once(hostile: Stack, hredis: redis.Redis) -> None:
    schema = {"type": "object", "properties": {"marker_field_xyz": {"type": "string"}}}
    with client(hostile, "alpha") as alpha:
        job = submit(alpha, 1, 2, response_format=fmt(schema))[0]
        wait_terminal(hredis, [job], 30)
        raw: dict[str, str] = hredis.hgetall(keys.job(job))  # type: ignore[assignment]
        held = sum(v.count("marker_field_xyz") for v in raw.values())
        assert held == 1, {k: v for k, v in raw.items() if "marker_field_xyz" in v}
        rec = alpha.get(f"/v1/jobs/{job}").json()
        assert rec["request"]["response_format"]["json_schema"]["schema"] == schema
        assert json.loads(raw["spec"])["params"]["json_schema"] == schema


def test_cache_prompt_reaches_the_engine_spec(hostile: Stack, hredis: redis.Redis) -> None:
    """llama-server's per-request switch, on the native and OpenAI routes (default true)."""
    with client(hostile, "alpha") as alpha:
        off = submit(alpha, 1, 2, cache_prompt=False)[0]
        on = submit(alpha, 1, 2)[0]
        chat = alpha.post("/v1/chat/completions", json={**CHAT, "cache_prompt": False})
        assert chat.status_code == 200
    for job, want in ((off, False), (on, True), (chat.headers["X-Tokenq-Job-Id"], False)):
        spec = json.loads(hredis.hget(keys.job(job), "spec") or "{}")
        assert spec["params"]["cache_prompt"] is want, job
