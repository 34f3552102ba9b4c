"""Tool calling without a model: request checks, rendering, constraints, parsing, streaming."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tokenq.api.errors import InvalidRequest
from tokenq.api.openai import tools
from tokenq.api.openai.tool_parsers import ToolStream, parse, tool_calls
from tokenq.api.openai.tools import Plan
from tokenq.shared.chat import render_chat
from tokenq.shared.schema_budget import GrammarBudget
from tokenq.shared.schemas import JobRequest, ToolDef
from tokenq.shared.settings import ModelConfig

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def req(**kw: Any) -> JobRequest:
    return JobRequest.model_validate({"model": "m", "messages": USER, **kw})


def the_plan(mode: str, fmt: str = "generic", parallel: bool = True) -> Plan:
    named = "get_weather" if mode == "named" else None
    return Plan(mode=mode, fmt=fmt, parallel=parallel, named=named,  # type: ignore[arg-type]
                tools=[ToolDef.model_validate(WEATHER), ToolDef.model_validate(TIME)])


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f\n"}}]}, "tools[0]"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "array"}}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "no-such-type"}}}}}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                          "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
     "tools"),
    ({"messages": [*USER, {"role": "tool", "tool_call_id": "x", "content": "1"}]},
     "messages[1]"),
])
def test_bad_tools_are_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        tools.validate(req(**body))
    assert (e.value.param or "").startswith(param)


def test_deep_schema_is_refused() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(InvalidRequest, match="deeper"):
        tools.check_tool_schema(deep, "p")


def test_constraint_over_the_grammar_budget_is_refused() -> None:
    big = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "maxLength": 20000}}}}}
    plan = Plan(mode="required", fmt="generic", parallel=True, named=None,
                tools=[ToolDef.model_validate(big)])
    with pytest.raises(InvalidRequest) as info:
        tools.checked_constraint(plan, GrammarBudget())
    assert info.value.code == "schema_too_complex" and info.value.param == "tools"
    assert tools.checked_constraint(the_plan("required"), GrammarBudget()) is not None
    assert tools.checked_constraint(the_plan("auto", fmt="hermes"), GrammarBudget()) is None


def test_format_follows_the_registry_and_the_template() -> None:
    assert tools.tool_format(ModelConfig(path="x"), "{{ messages }}") == "generic"
    hermes = "{% if tools %}{{ tools }}{% endif %}<tool_call>"
    assert tools.tool_format(ModelConfig(path="x"), hermes) == "hermes"
    assert tools.tool_format(ModelConfig(path="x", tool_call_parser="generic"),
                             hermes) == "generic"


def test_generic_rendering_describes_tools_and_history() -> None:
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    r = req(messages=history, tools=[WEATHER])
    tools.validate(r)
    p = tools.plan(r, ModelConfig(path="x"), None)
    assert p is not None and p.mode == "auto" and p.fmt == "generic"
    msgs, native = tools.render(p, [m.model_dump() for m in r.messages or []])
    assert native is None and msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]
    assert json.loads(msgs[2]["content"])["tool_calls"][0]["arguments"]["city"] == "Paris"
    assert json.loads(msgs[3]["content"])["tool_response"]["tool"] == "get_weather"
    text = render_chat("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
                       msgs, "", "")
    assert "21 C" in text


def test_constraints_accept_what_the_parser_reads() -> None:
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
             {"name": "get_time", "arguments": {"tz": "CET"}}]
    auto = tools.constraint(the_plan("auto"))
    assert auto is not None
    jsonschema.validate({"tool_calls": calls}, auto)
    jsonschema.validate({"response": "hi"}, auto)
    single = tools.constraint(the_plan("auto", parallel=False))
    assert single is not None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"tool_calls": calls}, single)
    req_ = tools.constraint(the_plan("required"))
    assert req_ is not None
    jsonschema.validate([{"name": c["name"], "parameters": c["arguments"]} for c in calls], req_)
    assert tools.constraint(the_plan("named")) == WEATHER["function"]["parameters"]
    assert tools.constraint(the_plan("auto", "hermes")) is None


@pytest.mark.parametrize(("mode", "fmt", "text", "content", "calls"), [
    ("named", "generic", '{"city": "Paris", "unit": "c"}', None,
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    ("required", "generic", '[{"name": "get_time", "parameters": {"tz": "UTC"}},'
     ' {"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f"}}]', None,
     [("get_time", {"tz": "UTC"}), ("get_weather", {"city": "Oslo", "unit": "f"})]),
    ("auto", "generic", '{"tool_calls": [{"name": "get_time", "arguments": {"tz": "A\\"B"}}]}',
     None, [("get_time", {"tz": 'A"B'})]),
    ("auto", "generic", '{"response": "Hello \\u00e9 \\"x\\""}', 'Hello é "x"', []),
    ("auto", "generic", "not json at all", "not json at all", []),
    # cut by max_tokens inside the wrapper: the scaffold is not the reply's content
    *[("auto", "generic", cut, None, []) for cut in ('{', '{"', '{"response', '{"response":',
                                                     '{ "tool_calls', '{"tool_calls": ')],
    ("auto", "hermes", 'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": '
     '{"tz": "UTC"}}\n</tool_call>\n<tool_call>{"name": "get_weather", "arguments": '
     '{"city": "Rome", "unit": "c"}}</tool_call>', "Let me check.\n",
     [("get_time", {"tz": "UTC"}), ("get_weather", {"city": "Rome", "unit": "c"})]),
    ("auto", "hermes", "Just words.", "Just words.", []),
])
def test_parse_and_stream_agree(mode: str, fmt: str, text: str, content: str | None,
                                calls: list[tuple[str, dict[str, Any]]]) -> None:
    p = the_plan(mode, fmt)
    got_content, got = tool_calls(p, text)
    assert got_content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in got)
    # One character at a time, as a stream: the deltas add up to the same answer.
    s = ToolStream(p)
    deltas = [d for ch in text for d in s.feed(ch)] + s.finish()
    streamed = "".join(d.get("content", "") for d in deltas) or None
    assert streamed == content
    args: dict[int, str] = {}
    names: dict[int, str] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in names and tc["type"] == "function"
                names[tc["index"]] = tc["function"]["name"]
            args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
    assert [(names[i], json.loads(args[i])) for i in sorted(names)] == calls
    assert s.called == bool(calls)


@pytest.mark.parametrize(("text", "content"), [
    ('{"response": "smile \\ud83d\\ude00 ok"}', "smile \U0001f600 ok"),  # a pair
    ('{"response": "half \\ud83d ok"}', "half \ufffd ok"),  # a half alone: U+FFFD
    ('{"response": "low \\ude00"}', "low \ufffd"),
])
def test_escaped_surrogates_stream_as_the_whole_text(text: str, content: str) -> None:
    """A pair's escapes split across tokens: the stream held back the first half, sent
    it alone (no UTF-8 can carry it: the SSE write raised) and never sent the emoji."""
    p = the_plan("auto")
    assert tool_calls(p, text)[0] == content
    for step in (1, 3, 7):
        s = ToolStream(p)
        deltas = [d for i in range(0, len(text), step) for d in s.feed(text[i:i + step])]
        streamed = "".join(d.get("content", "") for d in deltas + s.finish())
        assert streamed == content, (step, streamed)
        for d in deltas:
            json.dumps(d, ensure_ascii=False).encode()  # each delta can go on the wire


def test_call_ids_follow_from_the_job() -> None:
    """A batch output file is rendered from the records on every download: its call ids
    must not change between downloads (they were random per render); a job's stream and
    its record give the same ids too."""
    text = ('[{"name": "get_time", "parameters": {"tz": "A"}}, '
            '{"name": "get_weather", "parameters": {"city": "B", "unit": "c"}}]')
    p = the_plan("required")
    ids = [c["id"] for c in tool_calls(p, text, "job_1")[1]]
    assert ids == [c["id"] for c in tool_calls(p, text, "job_1")[1]]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    assert not set(ids) & {c["id"] for c in tool_calls(p, text, "job_2")[1]}
    s = ToolStream(p, "job_1")
    streamed = [tc["id"] for ch in text for d in s.feed(ch) for tc in d.get("tool_calls", [])
                if "id" in tc]
    assert streamed == ids


def test_parallel_false_keeps_one_hermes_call() -> None:
    text = ('<tool_call>{"name": "get_time", "arguments": {"tz": "A"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {"tz": "B"}}</tool_call>')
    assert len(parse(the_plan("auto", "hermes", parallel=False), text).calls) == 1


def test_cut_text_gives_a_prefix_not_a_crash() -> None:
    _, got = tool_calls(the_plan("required"), '[{"name": "get_time", "parameters": {"tz": "U')
    assert got[0]["function"]["arguments"] == '{"tz": "U'


def test_defs_move_to_the_root() -> None:
    params = {"type": "object", "properties": {"where": {"$ref": "#/$defs/place"}},
              "required": ["where"], "$defs": {"place": {"enum": ["home", "work"]}}}
    p = Plan(mode="required", fmt="generic", tools=[ToolDef.model_validate(
        {"type": "function", "function": {"name": "go", "parameters": params}})])
    schema = tools.constraint(p)
    assert schema is not None and schema["$defs"] == params["$defs"]
    jsonschema.validate([{"name": "go", "parameters": {"where": "home"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "go", "parameters": {"where": "mars"}}], schema)


HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t['function'] | tojson }}"
    "{% endfor %}\nCall them as <tool_call>{\"name\", \"arguments\"}</tool_call><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}<tool_call>{{ {'name': c['function']['name'], "
    "'arguments': c['function']['arguments']} | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")


def test_hermes_template_renders_tools_and_history_itself() -> None:
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]
    r = req(messages=history, tools=[WEATHER, TIME])
    p = tools.plan(r, ModelConfig(path="x"), HERMES_TEMPLATE)
    assert p is not None and p.fmt == "hermes" and tools.constraint(p) is None
    msgs, native = tools.render(p, [m.model_dump() for m in r.messages or []])
    assert native is not None and [t["function"]["name"] for t in native] == [
        "get_weather", "get_time"]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"tz": "UTC"}
    text = render_chat(HERMES_TEMPLATE, msgs, "", "", native)
    assert '"name": "get_weather"' in text and '<tool_call>{"name": "get_time"' in text
    assert "<|im_start|>tool\n12:00" in text
    none = tools.plan(req(messages=history, tools=[WEATHER], tool_choice="none"),
                      ModelConfig(path="x"), HERMES_TEMPLATE)
    assert none is not None and tools.render(none, msgs)[1] is None
