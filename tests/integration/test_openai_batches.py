"""OpenAI Files and Batch API through the official SDK, on the real stack and models."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import redis

from tests.conftest import EMBED, MAX_BATCH_LINES, NO_WORKER_MODEL, SMOL
from tokenq.cli.stack import Stack
from tokenq.shared import keys

QUESTIONS = ["Name a colour.", "Name a fruit.", "Name an animal.", "Name a city.",
             "Name a planet.", "Name a tree."]


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


def chat_line(custom_id: str, content: str, model: str = SMOL, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": content}], **body}}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def wait_status(oai: openai.OpenAI, batch_id: str, want: set[str], timeout: float = 600
                ) -> Any:
    deadline = time.time() + timeout
    while (b := oai.batches.retrieve(batch_id)).status not in want:
        assert time.time() < deadline, b
        assert b.status not in {"failed", "expired", "cancelled", "completed"} - want, b
        time.sleep(0.3)
    return b


def read_lines(oai: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in oai.files.content(file_id).text.splitlines() if x]


def test_file_roundtrip_and_delete(oai: openai.OpenAI) -> None:
    data = jsonl([chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)]) + "한국어 ✓\n".encode()
    f = oai.files.create(file=("in.jsonl", data), purpose="batch")
    assert f.id.startswith("file-") and f.bytes == len(data) and f.purpose == "batch"
    assert oai.files.retrieve(f.id).filename == "in.jsonl"
    assert oai.files.content(f.id).content == data
    assert f.id in {x.id for x in oai.files.list(purpose="batch")}
    assert oai.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(f.id)
    with pytest.raises(openai.BadRequestError) as info:  # as OpenAI answers it
        oai.files.create(file=("empty.jsonl", b""), purpose="batch")
    assert info.value.body["param"] == "file"  # type: ignore[index]
    assert "empty" in info.value.body["message"]  # type: ignore[index]


def test_batch_runs_to_completed_with_every_custom_id(oai: openai.OpenAI) -> None:
    lines = [chat_line(f"req-{i}", q) for i, q in enumerate(QUESTIONS)]
    f = oai.files.create(file=("b.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h", metadata={"job": "demo"})
    assert b.status == "validating" and b.metadata == {"job": "demo"}
    done = wait_status(oai, b.id, {"completed"})
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (6, 6, 0)
    assert done.output_file_id and done.error_file_id is None
    assert done.completed_at and done.in_progress_at
    out = read_lines(oai, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    for x in out:
        body = x["response"]["body"]
        assert x["response"]["status_code"] == 200 and x["error"] is None
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] <= 8
    assert b.id in {x.id for x in oai.batches.list()}
    with pytest.raises(openai.ConflictError):
        oai.batches.cancel(b.id)  # a completed batch cannot be cancelled


def test_invalid_lines_fail_validation_and_enqueue_nothing(
        oai: openai.OpenAI, stack_redis: redis.Redis) -> None:
    lines: list[Any] = [
        chat_line("ok-1", "hi"),
        "{not json",
        {**chat_line("wrong-url", "hi"), "url": "/v1/embeddings"},
        chat_line("ok-1", "duplicate id"),
        chat_line("unknown-model", "hi", model="no-such-model"),
        chat_line("too-long", "hi", max_tokens=10**6),
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        {k: v for k, v in chat_line("no-method", "hi").items() if k != "method"},
        chat_line("two-choices", "hi", n=2),
        chat_line("logprobs", "hi", logprobs=True),
    ]
    depth = stack_redis.llen(keys.queue(SMOL, "low"))
    f = oai.files.create(file=("bad.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    failed = wait_status(oai, b.id, {"failed"}, timeout=60)
    assert failed.errors is not None and failed.errors.data is not None
    by_line = {e.line: e.code for e in failed.errors.data}
    assert set(by_line) == {2, 3, 4, 5, 6, 7, 8, 9, 10}, by_line
    assert by_line[2] == "invalid_json" and by_line[3] == "mismatched_url"
    assert by_line[4] == "duplicate_custom_id" and by_line[5] == "model_not_found"
    assert by_line[8] == "missing_required_parameter"  # OpenAI's lines name their method
    assert by_line[9] == by_line[10] == "invalid_request"
    assert failed.output_file_id is None and failed.request_counts is not None
    assert stack_redis.llen(keys.queue(SMOL, "low")) == depth
    hex_ = b.id.removeprefix("batch_")
    assert not list(stack_redis.scan_iter(f"tokenq:job:job_{hex_}_*"))


def test_batch_endpoint_and_file_checks(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oai.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                           completion_window="24h")
    assert info.value.body["param"] == "input_file_id"  # type: ignore[index]
    f = oai.files.create(file=("x.jsonl", jsonl([chat_line("a", "hi")])), purpose="user_data")
    with pytest.raises(openai.BadRequestError):
        oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        oai.batches.retrieve("batch_nope")


def test_cancel_queued_batch(oai: openai.OpenAI) -> None:
    """No worker ever consumes NO_WORKER_MODEL: every line waits, so cancel ends them all."""
    lines = [chat_line(f"c{i}", "hi", model=NO_WORKER_MODEL) for i in range(5)]
    f = oai.files.create(file=("c.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    wait_status(oai, b.id, {"in_progress"}, timeout=60)
    assert oai.batches.cancel(b.id).status in ("cancelling", "cancelled")
    done = wait_status(oai, b.id, {"cancelled"}, timeout=60)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 5)
    assert done.error_file_id and done.output_file_id is None
    errs = read_lines(oai, done.error_file_id)
    assert sorted(e["custom_id"] for e in errs) == [f"c{i}" for i in range(5)]
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    assert oai.batches.cancel(b.id).status == "cancelled"  # idempotent


def test_cancel_mid_run_keeps_finished_results(oai: openai.OpenAI) -> None:
    """Lines that ran (or were running at the cancel: they finish) are in the output file;
    only lines that never started are cancelled."""
    lines = [chat_line(f"m{i}", QUESTIONS[i % len(QUESTIONS)], max_tokens=24)
             for i in range(16)]
    f = oai.files.create(file=("m.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    deadline = time.time() + 600
    while True:
        cur = oai.batches.retrieve(b.id)
        if cur.request_counts and cur.request_counts.completed >= 1:
            break
        assert time.time() < deadline, cur
        assert cur.status in ("validating", "in_progress"), cur
        time.sleep(0.2)
    oai.batches.cancel(b.id)
    done = wait_status(oai, b.id, {"cancelled"})
    counts = done.request_counts
    assert counts is not None and counts.total == 16
    assert counts.completed >= 1 and counts.completed + counts.failed == 16
    assert counts.failed >= 1, "the cancel came too late to test anything"
    assert done.output_file_id and done.error_file_id
    out = read_lines(oai, done.output_file_id)
    errs = read_lines(oai, done.error_file_id)
    assert len(out) == counts.completed and len(errs) == counts.failed
    assert sorted(x["custom_id"] for x in out + errs) == sorted(x["custom_id"] for x in lines)
    assert all(x["response"]["status_code"] == 200 for x in out)
    assert {e["error"]["code"] for e in errs} == {"batch_cancelled"}
    assert {e["error"]["message"] for e in errs} == {"the request was cancelled before it ran"}


def test_batch_over_the_line_limit_fails_validation(oai: openai.OpenAI,
                                                    stack_redis: redis.Redis) -> None:
    lines = [chat_line(f"l{i}", "hi", model=NO_WORKER_MODEL) for i in range(MAX_BATCH_LINES + 1)]
    depth = stack_redis.llen(keys.queue(NO_WORKER_MODEL, "low"))
    f = oai.files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    failed = wait_status(oai, b.id, {"failed"}, timeout=120)
    assert failed.errors is not None and failed.errors.data is not None
    assert [e.code for e in failed.errors.data] == ["too_many_lines"]
    assert failed.errors.data[0].line == MAX_BATCH_LINES + 1
    assert stack_redis.llen(keys.queue(NO_WORKER_MODEL, "low")) == depth


def test_tool_calls_in_batch_lines(oai: openai.OpenAI) -> None:
    """A line with tools answers as the interactive route does: the calls read back out of
    the job's text with the plan its record keeps (the format chosen at submit)."""
    weather = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
               "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}},
             {"type": "function", "function": {"name": "get_time", "parameters": {
                 "type": "object", "properties": {}, "additionalProperties": False}}}]
    ask = "What is the weather like in Paris today?"
    lines = [chat_line("required", ask, tools=tools, tool_choice="required", max_tokens=96,
                       parallel_tool_calls=False),
             chat_line("named", ask, tools=tools, max_tokens=96, tool_choice={
                 "type": "function", "function": {"name": "get_weather"}}),
             chat_line("plain", ask)]
    f = oai.files.create(file=("t.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                           completion_window="24h")
    done = wait_status(oai, b.id, {"completed"})
    assert done.output_file_id and done.error_file_id is None
    # rendered from the records on each read: the same bytes, call ids included
    assert oai.files.content(done.output_file_id).content == \
        oai.files.content(done.output_file_id).content
    out = {x["custom_id"]: x["response"]["body"]["choices"][0]
           for x in read_lines(oai, done.output_file_id)}
    for cid, reason in (("required", "tool_calls"), ("named", "stop")):
        choice = out[cid]
        assert choice["finish_reason"] == reason, choice  # as on the interactive route
        msg = choice["message"]
        assert msg["content"] is None and len(msg["tool_calls"]) == 1, msg
        call = msg["tool_calls"][0]
        assert call["type"] == "function" and call["id"].startswith("call_")
        if cid == "named":
            assert call["function"]["name"] == "get_weather"
        if call["function"]["name"] == "get_weather":
            assert set(json.loads(call["function"]["arguments"])) == {"city"}
    assert out["plain"]["message"]["content"] and "tool_calls" not in out["plain"]["message"]


def embed_line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": EMBED, **body}}


def test_embeddings_in_batch_lines(oai: openai.OpenAI) -> None:
    """As on OpenAI: a batch of /v1/embeddings lines, each output line's body what the
    route answers for the same input, as floats or as base64."""
    texts = ["The customer was charged twice for one order.", "The refund was issued."]
    lines = [embed_line("floats", input=texts),
             embed_line("b64", input=texts[1], encoding_format="base64", user="agent-7"),
             embed_line("dims", input=texts[0], dimensions=384)]
    f = oai.files.create(file=("e.jsonl", jsonl(lines)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    done = wait_status(oai, b.id, {"completed"})
    assert done.output_file_id and done.error_file_id is None
    assert done.request_counts is not None and done.request_counts.completed == 3
    out = {x["custom_id"]: x["response"] for x in read_lines(oai, done.output_file_id)}
    direct = np.array([d.embedding for d in oai.embeddings.create(model=EMBED,
                                                                   input=texts).data])
    body = out["floats"]["body"]
    assert out["floats"]["status_code"] == 200 and body["object"] == "list"
    assert body["model"] == EMBED and body["usage"]["prompt_tokens"] > 10
    got = np.array([d["embedding"] for d in body["data"]])
    assert [d["index"] for d in body["data"]] == [0, 1] and got.shape == (2, 384)
    assert np.allclose(got, direct, atol=1e-4)
    (one,) = out["b64"]["body"]["data"]
    vec = np.frombuffer(base64.b64decode(one["embedding"]), dtype=np.float32)
    assert np.allclose(vec, direct[1], atol=1e-4)
    assert np.allclose(out["dims"]["body"]["data"][0]["embedding"], direct[0], atol=1e-4)


def test_embeddings_lines_are_checked(oai: openai.OpenAI) -> None:
    """A chat model, a size the model does not make, a chat body: each its line's error;
    and the inputs of all lines together are bounded (OpenAI's 50,000)."""
    bad = [embed_line("chat-model", model=SMOL, input="hi"),
           embed_line("dims", input="hi", dimensions=64),
           embed_line("no-input", messages=[{"role": "user", "content": "hi"}]),
           embed_line("ok", input="hi")]
    f = oai.files.create(file=("bad.jsonl", jsonl(bad)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    failed = wait_status(oai, b.id, {"failed"}, timeout=120)
    assert failed.errors is not None and failed.errors.data is not None
    assert {e.line: e.param for e in failed.errors.data} == {
        1: "body.model", 2: "body.dimensions", 3: "body.input"}, failed.errors.data
    many = [embed_line(f"l{i}", input=["a"] * 2048) for i in range(25)]  # 51,200 inputs
    f = oai.files.create(file=("many.jsonl", jsonl(many)), purpose="batch")
    b = oai.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                           completion_window="24h")
    failed = wait_status(oai, b.id, {"failed"}, timeout=300)
    assert failed.errors is not None and failed.errors.data is not None
    assert [(e.code, e.line) for e in failed.errors.data] == [("too_many_inputs", 25)]
