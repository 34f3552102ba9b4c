"""What the official SDK sends, through the API in-process (no worker): null optional
flags are accepted, stream_options without stream and an empty embedding input are 400s
in OpenAI's envelope naming their field, and nothing is enqueued."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tokenq.api.app import create_app
from tokenq.shared.redis_server import EmbeddedRedis

MODEL = "fake-inproc"
MSG = [{"role": "user", "content": "hi"}]
pytestmark = pytest.mark.usefixtures("r")  # db 15, flushed


@pytest.fixture
def c(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(fake_settings(redis_server, tmp_path, [MODEL]))) as client:
        yield client


def jobs(r: redis.Redis) -> int:
    return sum(1 for k in r.scan_iter("tokenq:job:*") if k.count(":") == 2)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MSG, "stream": None, "logprobs": None,
                              "top_logprobs": None, "parallel_tool_calls": None,
                              "stream_options": None}),
    ("/v1/chat/completions", {"messages": MSG, "stream": False, "stream_options": None}),
    ("/v1/completions", {"prompt": "x", "echo": None, "stream": None,
                         "stream_options": None}),
])
def test_null_flags_pass_validation(c: TestClient, path: str, body: dict[str, Any]) -> None:
    # an unknown model: the body was read (a refused body would be a 400 naming a field)
    resp = c.post(path, json={"model": "no-such-model", **body})
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(("path", "body", "param", "message"), [
    ("/v1/chat/completions", {"messages": MSG, "stream_options": {"include_usage": True}},
     "stream_options", "stream_options can only be set when stream is true"),
    ("/v1/chat/completions", {"messages": MSG, "stream": False,
                              "stream_options": {"include_usage": True}},
     "stream_options", "stream_options can only be set when stream is true"),
    ("/v1/completions", {"prompt": "x", "stream": None, "stream_options": {}},
     "stream_options", "stream_options can only be set when stream is true"),
    ("/v1/embeddings", {"input": ["a", ""]}, "input", "input[1] is empty"),
    ("/v1/jobs", {"input": ["a", ""]}, "input", "input[1] is empty"),
    # a model's own check names its field; a union's branch is not part of the name
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, "top_logprobs",
     "set logprobs to true"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "echo is not supported"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "give one string"),
    ("/v1/jobs", {"prompt": "x", "messages": MSG}, "prompt", "exactly one of"),
    ("/v1/chat/completions", {"messages": MSG, "stop": 123}, "stop", "valid string"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 123}]},
     "messages.0.content", "valid string"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "sometimes"}, "tool_choice",
     "tool_choice: "),
    # OpenAI's types, not pydantic's lax reading: these were taken as true and as 1
    ("/v1/chat/completions", {"messages": MSG, "stream": "yes"}, "stream",
     "expected true or false"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, "max_tokens",
     "expected a number"),
])
def test_refused_naming_the_field(c: TestClient, r: redis.Redis, path: str,
                                  body: dict[str, Any], param: str, message: str) -> None:
    before = jobs(r)
    # an unknown model: refused for the field before the model is looked up (and a
    # request taken would be a 404 here, never a job that waits for no worker)
    resp = c.post(path, json={"model": "no-such-model", **body})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_request"
    assert err["param"] == param and message in err["message"], err
    assert "Value error" not in err["message"] and "body:" not in err["message"], err
    assert jobs(r) == before


def test_ready_answers_within_seconds_when_redis_stalls(tmp_path: Path) -> None:
    """An outside probe: with Redis stopped (SIGSTOP), /ready took 20.7 s to answer 503
    (socket timeout and retries); a readiness probe's own timeout is ~1 s. Now ~2 s."""
    own = EmbeddedRedis(tmp_path / "redis", appendonly=False).start()
    try:
        with TestClient(create_app(fake_settings(own, tmp_path, [MODEL]))) as client:
            assert client.get("/ready", params={"workers": "false"}).status_code == 200
            assert own.proc is not None
            os.kill(own.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                resp = client.get("/ready", params={"workers": "false"})
                took = time.monotonic() - t0
            finally:
                os.kill(own.proc.pid, signal.SIGCONT)
            assert resp.status_code == 503 and resp.json()["status"] == "unavailable"
            assert took < 10, took  # 20.7 s before; READY_TIMEOUT_S is 2
    finally:
        own.stop()
