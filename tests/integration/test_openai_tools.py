"""Tool calling with the official openai SDK on the llama.cpp worker (the bundled SmolLM2,
whose template has no tool support: the generic format). Arguments are checked against
each tool's schema; which tool a 135M model picks, and what it answers, is not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import redis

from tests.conftest import SMOL
from tests.surface_checks import job_records, sdk
from tokenq.cli.stack import Stack

WEATHER_ARGS = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME_ARGS = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 16}},
             "required": ["timezone"], "additionalProperties": False}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description":
                                      "The current weather in a city",
                                      "parameters": WEATHER_ARGS}},
    {"type": "function", "function": {"name": "get_time", "description":
                                      "The current time in a timezone",
                                      "parameters": TIME_ARGS}},
]
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
ASK: list[Any] = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with sdk(stack.url) as c:
        yield c


def chat(oai: openai.OpenAI, **kw: Any) -> Any:
    body: dict[str, Any] = {"model": SMOL, "messages": ASK, "tools": TOOLS, "max_tokens": 96,
                            "temperature": 0}
    return oai.chat.completions.create(**{**body, **kw})


def check_calls(calls: Any, finish_reason: str = "tool_calls") -> None:
    """Every call's arguments validate (all but the last when max_tokens cut the text: that
    one's arguments are a prefix, as response_format's text is)."""
    calls = list(calls or [])
    for c in calls[:-1] if finish_reason == "length" else calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_required_call_parses_and_validates(oai: openai.OpenAI) -> None:
    out = chat(oai, tool_choice="required")
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and choice.message.tool_calls
    check_calls(choice.message.tool_calls)


def test_named_call_is_that_function(oai: openai.OpenAI) -> None:
    out = chat(oai, tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's and vLLM's answer for a named call
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    check_calls([call])


def test_auto_answers_with_calls_or_text(oai: openai.OpenAI) -> None:
    choice = chat(oai, tool_choice="auto").choices[0]
    if choice.message.tool_calls:  # this model keeps calling: it may run to max_tokens
        assert choice.finish_reason in ("tool_calls", "length")
        assert choice.message.content is None
        check_calls(choice.message.tool_calls, choice.finish_reason)
    else:
        assert choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str)


def test_none_answers_with_text(oai: openai.OpenAI) -> None:
    choice = chat(oai, tool_choice="none", max_tokens=12).choices[0]
    assert not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_parallel_false_gives_at_most_one_call(oai: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Weather in Paris, Rome and Oslo, and the time in "
                                       "Tokyo?"}]
    for choice in ("required", "auto"):
        out = chat(oai, messages=ask, tool_choice=choice, parallel_tool_calls=False)
        assert len(out.choices[0].message.tool_calls or []) <= 1
        if choice == "required":  # one call, and the constraint ends the text there
            assert out.choices[0].finish_reason == "tool_calls"
        check_calls(out.choices[0].message.tool_calls, out.choices[0].finish_reason)


@pytest.mark.parametrize("tool_choice", ["required", "auto",
                                         {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_deltas_reassemble(oai: openai.OpenAI, tool_choice: Any) -> None:
    # One call at most, so the text ends within max_tokens and the arguments are whole.
    whole = chat(oai, tool_choice=tool_choice, parallel_tool_calls=False).choices[0]
    chunks = list(chat(oai, tool_choice=tool_choice, stream=True, parallel_tool_calls=False))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls: dict[int, dict[str, Any]] = {}
    content = ""
    finals = []
    for ch in chunks:
        d = ch.choices[0].delta
        content += d.content or ""
        if ch.choices[0].finish_reason:
            finals.append(ch.choices[0].finish_reason)
        for tc in d.tool_calls or []:
            if tc.id is not None:  # a call's first delta: id, type and name
                assert tc.index not in calls and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
    assert finals == [whole.finish_reason]
    assert sorted(calls) == list(range(len(calls)))
    want = [(c.function.name, json.loads(c.function.arguments))
            for c in whole.message.tool_calls or []]
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == want
    for c in calls.values():
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    assert (content or None) == whole.message.content


def test_multi_turn_with_a_tool_result(oai: openai.OpenAI) -> None:
    first = chat(oai, tool_choice="required").choices[0].message
    call = first.tool_calls[0]
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees, sunny"}]
    out = chat(oai, messages=history, tool_choice="none", max_tokens=16)
    assert out.choices[0].message.content
    again = chat(oai, messages=history, tool_choice="auto").choices[0]
    check_calls(again.message.tool_calls, again.finish_reason)


def test_job_record_keeps_the_raw_text(oai: openai.OpenAI, client: httpx.Client) -> None:
    resp = oai.chat.completions.with_raw_response.create(
        model=SMOL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=96,
        temperature=0)
    out = resp.parse()
    rec = client.get(f"/v1/jobs/{resp.headers['x-tokenq-job-id']}").json()
    assert rec["status"] == "succeeded" and rec["request"]["tool_choice"] == "required"
    assert rec["tool_format"] == "generic"
    got = json.loads(rec["output"])
    assert [c["name"] for c in got] == [c.function.name for c in out.choices[0].message.tool_calls]


BAD: list[tuple[str, dict[str, Any]]] = [
    ("schema not an object", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}),
    ("invalid schema", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}}]}),
    ("bad name", {"tools": [{"type": "function", "function": {"name": "no spaces"}}]}),
    ("duplicate names", {"tools": [TOOLS[0], TOOLS[0]]}),
    ("unknown named choice", {"tool_choice": {"type": "function", "function": {"name": "x"}}}),
    ("choice without tools", {"tools": None, "tool_choice": "required"}),
    ("too many tools", {"tools": [{"type": "function", "function": {"name": f"f{i}"}}
                                  for i in range(129)]}),
    ("tool message without its call", {"messages": [*ASK, {"role": "tool",
                                                           "tool_call_id": "call_x",
                                                           "content": "1"}]}),
    ("tool message without an id", {"messages": [*ASK, {"role": "tool", "content": "1"}]}),
    ("user message without content", {"messages": [{"role": "user"}]}),
    # a grammar this large crashes llama.cpp's builder: refused by the grammar budgets
    ("over the grammar budget", {"tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "string", "maxLength": 20000}}}}}]}),
]


@pytest.mark.parametrize(("name", "kw"), BAD, ids=[b[0] for b in BAD])
def test_bad_tool_requests_are_400_and_enqueue_nothing(
        oai: openai.OpenAI, stack_redis: redis.Redis, name: str, kw: dict[str, Any]) -> None:
    body: dict[str, Any] = {"model": SMOL, "messages": ASK, "tools": TOOLS, "max_tokens": 4}
    body.update(kw)
    body = {k: v for k, v in body.items() if v is not None}
    before = job_records(stack_redis)
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(**body)
    assert info.value.status_code == 400, name
    err = info.value.body
    assert isinstance(err, dict) and err["message"] and "type" in err
    assert job_records(stack_redis) == before
