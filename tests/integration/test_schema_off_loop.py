"""A request's heavy schemas (response_format, tools' parameters) are walked against the
meta-schema on the CPU pool, never on the event loop, and a schema that passed is not
walked again (shared/schema_meta.py).

Before, the walk ran on the loop: 0.74 s for a 900-property schema within every budget,
so eight such requests at once stood another tenant's stream still for 2.5-3.3 s, and a
batch of such lines for minutes (each line is checked at validation and at enqueue)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tokenq.api.app import create_app
from tokenq.shared import schema_meta
from tokenq.shared.redis_server import EmbeddedRedis

MODEL = "fake-schemas"
pytestmark = pytest.mark.usefixtures("r")  # db 15, flushed


def _object(n: int) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]  # a schema no earlier test made (the digests are remembered)
    props = {f"p{i}_{tag}": {"type": "string", "maxLength": 10} for i in range(n)}
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def test_heavy_schemas_are_walked_off_the_loop_and_once(
        redis_server: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where: list[str] = []
    real = schema_meta.Draft202012Validator.check_schema

    class Spy:
        @staticmethod
        def check_schema(schema: Any) -> None:
            where.append(threading.current_thread().name)
            real(schema)

    monkeypatch.setattr(schema_meta, "Draft202012Validator", Spy)
    app = create_app(fake_settings(redis_server, tmp_path, [MODEL]))
    chat = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as c:
        heavy = _object(300)
        resp = c.post("/v1/jobs", json={**chat, "response_format": _fmt(heavy)})
        assert resp.status_code == 202, resp.text
        assert len(where) == 1 and where[0].startswith("tokenq-cpu"), where
        # the same schema again (a batch's next line): not walked again
        resp = c.post("/v1/jobs", json={**chat, "response_format": _fmt(heavy)})
        assert resp.status_code == 202 and len(where) == 1, where
        # tools' parameters, each heavy only together
        tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": _object(12)}}
                 for i in range(8)]
        resp = c.post("/v1/jobs", json={**chat, "tools": tools})
        assert resp.status_code == 202, resp.text
        assert len(where) == 9 and all(w.startswith("tokenq-cpu") for w in where[1:]), where
        # a small schema is cheaper to walk than to hand to a thread
        resp = c.post("/v1/jobs", json={**chat, "response_format": _fmt(_object(3))})
        assert resp.status_code == 202 and len(where) == 10, where
        assert not where[-1].startswith("tokenq-cpu"), where
        # an invalid heavy schema is still the client's 400, from the pool
        bad = _object(300)
        bad["properties"][next(iter(bad["properties"]))]["maxLength"] = -1
        resp = c.post("/v1/jobs", json={**chat, "response_format": _fmt(bad)})
        assert resp.status_code == 400, resp.text
        assert "not a valid JSON schema" in resp.json()["error"]["message"]


def test_a_large_body_is_parsed_off_the_loop(
        redis_server: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid 945 kB chat of 27,000 messages took 0.1-0.2 s of the event loop to parse and
    validate; sixteen at once stood another tenant's stream still 1.3-1.9 s."""
    from tokenq.api import body as body_module

    where: list[str] = []
    real = body_module.parse

    def spy(model: Any, raw: bytes) -> Any:
        where.append(threading.current_thread().name)
        return real(model, raw)

    monkeypatch.setattr(body_module, "parse", spy)
    app = create_app(fake_settings(redis_server, tmp_path, [MODEL]))
    many = [{"role": "user", "content": "x" * 40_000}] * 3  # 120 kB, 3 words (the fake's tokens)
    with TestClient(app) as c:
        resp = c.post("/v1/jobs", json={"model": MODEL, "max_tokens": 4, "messages": many})
        assert resp.status_code == 202, resp.text
        assert where[-1].startswith("tokenq-cpu"), where
        resp = c.post("/v1/jobs", json={"model": MODEL, "max_tokens": 4, "prompt": "hi"})
        assert resp.status_code == 202 and not where[-1].startswith("tokenq-cpu"), where
        # the client's errors are the same 400s either way
        resp = c.post("/v1/jobs", json={"model": MODEL, "max_tokens": -1, "messages": many})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_tokens"
        resp = c.post("/v1/jobs", content=b'{"model": "' + b"x" * 100_000,
                      headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
        assert where[-1].startswith("tokenq-cpu")
