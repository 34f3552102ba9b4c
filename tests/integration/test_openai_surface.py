"""The OpenAI surface on llama.cpp: /tokenize, /detokenize, max_model_len, logit_bias,
min_p, penalties, response_format on completions, unknown fields, x-should-retry."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import pytest
import redis

from tests import surface_checks as checks
from tests.conftest import NO_WORKER_MODEL, SMOL
from tokenq.cli.stack import Stack
from tokenq.shared import keys


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def test_tokenize_detokenize_and_context(client: httpx.Client, oai: openai.OpenAI,
                                         stack: Stack) -> None:
    checks.check_tokenize_roundtrip(client, oai, SMOL)
    cfg = stack.settings.models()[SMOL]
    # What one job may use on llama.cpp: its slot's share of the KV cache.
    assert oai.models.retrieve(SMOL).max_model_len == cfg.n_ctx // cfg.n_parallel  # type: ignore[attr-defined]


def test_tokenize_bad_input(client: httpx.Client) -> None:
    checks.check_tokenize_bad_input(client, SMOL)


def test_logit_bias(client: httpx.Client, oai: openai.OpenAI) -> None:
    checks.check_logit_bias(client, oai, SMOL)


def test_min_p_and_penalties(oai: openai.OpenAI) -> None:
    checks.check_min_p_and_penalties(oai, SMOL)


def test_sampling_bad_input_enqueues_nothing(oai: openai.OpenAI,
                                             stack_redis: redis.Redis) -> None:
    before = checks.job_records(stack_redis)
    checks.check_sampling_bad_input(oai, SMOL)
    assert checks.job_records(stack_redis) == before


def test_response_format_on_completions(oai: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    out = oai.completions.create(
        model=SMOL, prompt="The capital of France as JSON:", max_tokens=40, temperature=0,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "c", "schema": schema}}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].text), schema)


def test_schemas_llama_cpp_cannot_convert_are_refused_and_recursive_ones_run(
        oai: openai.OpenAI, stack_redis: redis.Redis) -> None:
    """A pattern without ^...$ used to be accepted and the job failed on the worker; a
    pydantic recursive model (a root $ref) the same; `\\d` and `\\.` did not compile."""
    def fmt(schema: dict[str, object]) -> dict[str, object]:
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "s", "schema": schema}}}

    before = checks.job_records(stack_redis)
    for schema in ({"type": "string", "pattern": "[a-z]+"},
                   {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}):
        with pytest.raises(openai.BadRequestError) as err:
            oai.completions.create(model=SMOL, prompt="x", max_tokens=4, extra_body=fmt(schema))
        assert err.value.body["param"] == "response_format", err.value.body  # type: ignore[index]
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "[a-z]+"}}}}}
    with pytest.raises(openai.BadRequestError):  # a tool's schema is part of the grammar
        oai.chat.completions.create(model=SMOL, max_tokens=4, tools=[tool],  # type: ignore[list-item]
                                    tool_choice="required",
                                    messages=[{"role": "user", "content": "x"}])
    assert checks.job_records(stack_redis) == before
    node = {"$defs": {"Node": {"type": "object", "required": ["name", "kids"],
                               "additionalProperties": False,
                               "properties": {"name": {"type": "string", "maxLength": 8},
                                              "kids": {"type": "array", "maxItems": 1,
                                                       "items": {"$ref": "#/$defs/Node"}}}}},
            "$ref": "#/$defs/Node"}
    phone = {"type": "object", "required": ["phone"], "additionalProperties": False,
             "properties": {"phone": {"type": "string", "pattern": r"^\d{3}\.\d{4}$"}}}
    for schema, prompt in ((node, "A family tree as JSON:"), (phone, "A phone number as JSON:")):
        out = oai.completions.create(model=SMOL, prompt=prompt, max_tokens=96, temperature=0,
                                     extra_body=fmt(schema))
        if out.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(out.choices[0].text), schema)


def test_an_empty_prompt_is_a_400_and_enqueues_nothing(client: httpx.Client,
                                                         stack_redis: redis.Redis) -> None:
    """It was a 202 and then an engine error (a 500 on /v1/completions)."""
    before = checks.job_records(stack_redis)
    for path in ("/v1/completions", "/v1/jobs"):
        resp = client.post(path, json={"model": SMOL, "prompt": "", "max_tokens": 4})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "prompt"
    assert checks.job_records(stack_redis) == before


def test_the_default_max_tokens_is_cut_to_the_context_left(client: httpx.Client,
                                                           oai: openai.OpenAI) -> None:
    """A request that does not set max_tokens gets what its context has left (vLLM does
    the same) rather than a 400 naming a max_tokens it never sent; an explicit one that
    does not fit is still a 400."""
    context = oai.models.retrieve(SMOL).max_model_len  # type: ignore[attr-defined]
    def count(text: str) -> int:
        return int(client.post("/tokenize", json={"model": SMOL, "prompt": text}).json()["count"])

    chunk = "one two three four five six seven eight nine ten "
    prompt = chunk * ((context - 40) * 20 // count(chunk * 20))
    n, words = count(prompt), chunk.split()
    while n < context - 8:  # a word at a time up to a few tokens short of the context
        prompt += words[n % 10] + " "
        n = count(prompt)
    assert n < context
    out = oai.completions.create(model=SMOL, prompt=prompt, temperature=0)
    assert out.usage is not None and out.usage.completion_tokens <= context - n
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model=SMOL, prompt=prompt, max_tokens=64)


def test_unknown_fields_are_ignored(client: httpx.Client) -> None:
    resp = client.post("/v1/completions", json={
        "model": SMOL, "prompt": "Hi", "max_tokens": 2, "no_such_field": {"x": 1},
        "guided_whatever": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["object"] == "text_completion"


def test_terminal_failure_says_do_not_retry(stack: Stack, stack_redis: redis.Redis) -> None:
    """A job that ended (here cancelled while queued) answers x-should-retry: false, so the
    SDK does not submit it again."""
    before = set(stack_redis.zrange(keys.tenant_jobs("default"), 0, -1))
    result: dict[str, httpx.Response] = {}

    def call() -> None:
        with httpx.Client(base_url=stack.url, timeout=30) as c:
            result["r"] = c.post("/v1/completions", json={"model": NO_WORKER_MODEL,
                                                          "prompt": "x", "max_tokens": 2})

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 10
    while not (new := set(stack_redis.zrange(keys.tenant_jobs("default"), 0, -1)) - before):
        assert time.time() < deadline
        time.sleep(0.05)
    (job_id,) = new
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        assert c.delete(f"/v1/jobs/{job_id}").status_code == 200
    t.join(30)
    resp = result["r"]
    assert resp.status_code == 409 and resp.headers["x-should-retry"] == "false"
    assert resp.json()["error"]["code"] == "cancelled"
    assert resp.headers["x-tokenq-job-id"] == job_id  # as on a success: the job to look up


def test_logprobs_chat_and_completions(oai: openai.OpenAI) -> None:
    checks.check_logprobs(oai, SMOL)


def test_n_choices(oai: openai.OpenAI) -> None:
    checks.check_n(oai, SMOL)


def test_logprobs_and_n_bad_input_enqueues_nothing(oai: openai.OpenAI,
                                                   stack_redis: redis.Redis) -> None:
    before = checks.job_records(stack_redis)
    checks.check_logprobs_n_bad_input(oai, SMOL)
    assert checks.job_records(stack_redis) == before
