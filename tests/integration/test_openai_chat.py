"""The official openai SDK against a running stack: models, chat, completions, JSON output."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
import redis

from tests.conftest import NO_WORKER_MODEL, SMOL
from tests.surface_checks import job_records
from tokenq.cli.stack import Stack
from tokenq.shared import keys

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def test_models_list_and_retrieve(oai: openai.OpenAI) -> None:
    ids = {m.id for m in oai.models.list()}
    assert SMOL in ids
    assert oai.models.retrieve(SMOL).id == SMOL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_chat_non_streaming_matches_native_job(oai: openai.OpenAI, client: httpx.Client) -> None:
    resp = oai.chat.completions.with_raw_response.create(
        model=SMOL, messages=CHAT, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    job_id = resp.headers["x-tokenq-job-id"]
    out = resp.parse()
    assert out.object == "chat.completion"
    assert out.id == "chatcmpl-" + job_id.removeprefix("job_")
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    # It ran as a job through the queue: the job record holds the same text.
    rec = client.get(f"/v1/jobs/{job_id}").json()
    assert rec["status"] == "succeeded" and rec["output"] == choice.message.content
    # The same request posted as a native job gives the same text (temperature 0).
    native = client.post("/v1/jobs", json={"model": SMOL, "messages": CHAT, "max_tokens": 16,
                                           "temperature": 0}).json()
    deadline = time.time() + 60
    while (rec := client.get(f"/v1/jobs/{native['id']}").json())["status"] != "succeeded":
        assert time.time() < deadline, rec
        time.sleep(0.2)
    assert rec["output"] == choice.message.content


def test_chat_streaming_with_usage(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=SMOL, messages=CHAT, max_tokens=12, temperature=0,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finals in (["stop"], ["length"])
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == 12 or finals == ["stop"]
    full = oai.chat.completions.create(model=SMOL, messages=CHAT, max_tokens=12,  # type: ignore[arg-type]
                                       temperature=0)
    assert text == full.choices[0].message.content
    assert len({c.id for c in chunks}) == 1


def test_completions_plain_and_streamed(oai: openai.OpenAI) -> None:
    out = oai.completions.create(model=SMOL, prompt="The capital of France is", max_tokens=8,
                                 temperature=0)
    assert out.object == "text_completion" and out.choices[0].text
    assert out.usage is not None and out.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model=SMOL, prompt="The capital of France is", max_tokens=8, temperature=0,
        stream=True))
    assert streamed == out.choices[0].text


def test_sdk_nulls_and_special_tokens_in_logprobs(oai: openai.OpenAI) -> None:
    """Flags the SDK sends as null are their defaults; a special token among the
    alternatives shows as its text (`<|im_end|>`), never "", so none collide."""
    chat = oai.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Reply with one word: yes or no?"}],
        max_tokens=4, temperature=0, stream=None, logprobs=True, top_logprobs=20,
        stream_options=None)
    content = (chat.choices[0].logprobs and chat.choices[0].logprobs.content) or []
    alternatives = [t for e in content for t in e.top_logprobs]
    assert content and len(alternatives) == 20 * len(content)
    assert all(t.token and t.bytes == list(t.token.encode()) for t in alternatives
               if "\ufffd" not in t.token)
    assert "<|im_end|>" in {t.token for t in alternatives}
    assert "<|im_end|>" not in (chat.choices[0].message.content or "")
    comp = oai.completions.create(model=SMOL, prompt="Q: yes or no?\nA:", max_tokens=2,
                                  temperature=0, echo=None, stream=None, logprobs=20)
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.top_logprobs
    assert all(len(d) == 20 and "" not in d for d in lp.top_logprobs), lp.top_logprobs


SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {
        "issue": {"type": "string", "maxLength": 60},
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
        "follow_up": {"type": "boolean"},
    },
    "required": ["issue", "sentiment", "follow_up"],
    "additionalProperties": False,
}


def test_json_schema_output_validates(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(
        model=SMOL, max_tokens=80, temperature=0, extra_body={"repetition_penalty": 1.2},
        messages=[{"role": "user", "content": "Customer was charged twice; the agent "
                   "refunded the duplicate. Summarise the call as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "summary", "schema": SUMMARY_SCHEMA}})
    assert out.choices[0].finish_reason == "stop"
    doc = json.loads(out.choices[0].message.content or "")
    jsonschema.validate(doc, SUMMARY_SCHEMA)
    obj = oai.chat.completions.create(
        model=SMOL, max_tokens=60, temperature=0, extra_body={"repetition_penalty": 1.2},
        messages=[{"role": "user", "content": "Give a JSON object with a colour."}],
        response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    else:  # out of tokens mid-object: still a prefix of an object
        assert (obj.choices[0].message.content or "").lstrip().startswith("{")


def test_an_integer_s_bounds_hold(oai: openai.OpenAI) -> None:
    """The converter dropped `minimum`/`maximum`: this request came back `{ "n": 5000 }`
    with finish_reason `stop` (shared/json_grammar.py spells the range out now)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                     "maximum": 10}}, "required": ["n"]}
    out = oai.chat.completions.create(
        model=SMOL, max_tokens=40, temperature=0,
        messages=[{"role": "user", "content": "Output the number 5000 as JSON, and a long list."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "x", "strict": True, "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"model": "no-such-model"}, openai.NotFoundError),
    ({"n": 99}, openai.BadRequestError),
    ({"logprobs": True, "top_logprobs": 25}, openai.BadRequestError),
    ({"max_tokens": 0}, openai.BadRequestError),
    ({"stream_options": {"include_usage": True}}, openai.BadRequestError),  # needs stream
    ({"temperature": 5}, openai.BadRequestError),
    ({"messages": []}, openai.BadRequestError),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     openai.BadRequestError),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     openai.BadRequestError),
    # a keyword decoding cannot enforce, under strict; a schema nothing satisfies
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": {"type": "integer", "multipleOf": 7}}}},
     openai.BadRequestError),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}},
     openai.BadRequestError),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"e": {"type": "string", "format": "email"}}}}}]},
     openai.BadRequestError),
])
def test_bad_requests_raise_the_right_sdk_error(
        oai: openai.OpenAI, stack_redis: redis.Redis, kwargs: dict[str, object],
        exc: type[Exception]) -> None:
    body: dict[str, object] = {"model": SMOL, "messages": CHAT, "max_tokens": 4}
    body.update(kwargs)
    before = job_records(stack_redis)
    with pytest.raises(exc) as info:
        oai.chat.completions.create(**body)  # type: ignore[call-overload]
    assert isinstance(info.value, openai.APIStatusError)
    assert info.value.body and "message" in info.value.body  # type: ignore[operator]
    assert job_records(stack_redis) == before


def test_disconnect_cancels_the_job(stack: Stack, stack_redis: redis.Redis) -> None:
    """Interactive clients: a closed stream cancels its job (here a job that is queued
    because no worker consumes NO_WORKER_MODEL, so it must end `cancelled`, never run)."""
    with httpx.Client(base_url=stack.url, timeout=30) as c, c.stream(
            "POST", "/v1/chat/completions",
            json={"model": NO_WORKER_MODEL, "messages": CHAT, "stream": True}) as resp:
        assert resp.status_code == 200
        job_id = resp.headers["x-tokenq-job-id"]
        next(resp.iter_lines())  # the role chunk: the stream is open
    deadline = time.time() + 10
    while stack_redis.hget(keys.job(job_id), "state") != "cancelled":
        assert time.time() < deadline, stack_redis.hgetall(keys.job(job_id))
        time.sleep(0.1)


def test_non_streaming_disconnect_cancels_the_job(stack: Stack, stack_redis: redis.Redis
                                                  ) -> None:
    before = set(stack_redis.zrange(keys.tenant_jobs("default"), 0, -1))
    with httpx.Client(base_url=stack.url, timeout=1.5) as c, pytest.raises(httpx.ReadTimeout):
        c.post("/v1/chat/completions", json={"model": NO_WORKER_MODEL, "messages": CHAT})
    (job_id,) = set(stack_redis.zrange(keys.tenant_jobs("default"), 0, -1)) - before
    deadline = time.time() + 10
    while stack_redis.hget(keys.job(job_id), "state") != "cancelled":
        assert time.time() < deadline, stack_redis.hgetall(keys.job(job_id))
        time.sleep(0.1)
    # The access log says the client left (499, as nginx logs it), not a 500 nobody got.
    log = stack.settings.state_dir / "logs" / "api.log"
    deadline = time.time() + 10
    while "POST /v1/chat/completions 499 " not in log.read_text():
        assert time.time() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)
