"""Tool calling on the vLLM worker (structured outputs), with the official openai SDK. The
tiny random model's template has no tool support (the generic format); its text is noise,
so the schemas use enums and booleans: the constraint alone decides when a call ends. Names
use only characters of its small vocabulary (it has no `_`: a name with one cannot be
written, and the constraint ends the text there)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from tests.surface_checks import sdk
from tests.vllm.conftest import TINY
from tokenq.cli.stack import Stack

pytestmark = pytest.mark.vllm

ARGS = {"type": "object", "additionalProperties": False, "required": ["issue", "resolved"],
        "properties": {"issue": {"enum": ["refund", "delivery", "other"]},
                       "resolved": {"type": "boolean"}}}
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "refund", "description": "Refund a charge", "parameters": ARGS}}]
MSG: list[Any] = [{"role": "user", "content": "The customer called about a refund."}]
NAMED = {"type": "function", "function": {"name": "refund"}}
BODY: dict[str, Any] = {"model": TINY, "messages": MSG, "tools": TOOLS, "max_tokens": 64,
                        "parallel_tool_calls": False}


@pytest.fixture
def voai(vllm_stack: Stack) -> Iterator[openai.OpenAI]:
    with sdk(vllm_stack.url) as c:
        yield c


def create(voai: openai.OpenAI, **kw: Any) -> Any:
    return voai.chat.completions.create(**{**BODY, **kw})


@pytest.mark.parametrize(("tool_choice", "reason"), [("required", "tool_calls"),
                                                     (NAMED, "stop")])
def test_constrained_call(voai: openai.OpenAI, tool_choice: Any, reason: str) -> None:
    choice = create(voai, tool_choice=tool_choice).choices[0]
    assert choice.finish_reason == reason
    (call,) = choice.message.tool_calls
    assert call.function.name == "refund" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), ARGS)


@pytest.mark.parametrize(("tool_choice", "reason"), [("required", "tool_calls"),
                                                     (NAMED, "stop")])
def test_constrained_call_streamed(voai: openai.OpenAI, tool_choice: Any, reason: str) -> None:
    args, names, finals = "", [], []
    for ch in create(voai, tool_choice=tool_choice, stream=True):
        c = ch.choices[0]
        if c.finish_reason:
            finals.append(c.finish_reason)
        for tc in c.delta.tool_calls or []:
            assert tc.index == 0
            if tc.id is not None:
                names.append(tc.function.name)
            args += tc.function.arguments or ""
    assert finals == [reason] and names == ["refund"]
    jsonschema.validate(json.loads(args), ARGS)


def test_auto_generic_parses(voai: openai.OpenAI) -> None:
    """`auto` on a generic-format model: constrained to calls or a reply, parsed either way."""
    choice = create(voai, tool_choice="auto", max_tokens=48).choices[0]
    for call in choice.message.tool_calls or []:
        jsonschema.validate(json.loads(call.function.arguments), ARGS)
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
