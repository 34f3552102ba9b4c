"""Differential test: tokenq's `hermes` parser (api/openai/tool_parsers.py) against vLLM's
own Hermes2ProToolParser on the same texts, whole and streamed in several chunkings.

Why not vLLM's parser itself: tokenq reads a job's text in the API, and importing
vllm.tool_parsers there pulls in torch and transformers (seconds and ~0.5 GB per API
process) for a regular expression's work; the llama.cpp worker's text goes through the
same parser. This test is what makes tokenq's parser a stand-in: on every well-formed
text a Hermes-format model writes, both give the same content and the same calls (names,
and arguments as JSON values whole and as the very same text streamed). Where they differ
(a text cut inside a call, a block that is not JSON) is pinned below, on purpose.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from tokenq.api.openai.tool_parsers import ToolStream, tool_calls
from tokenq.api.openai.tools import Plan

pytestmark = pytest.mark.vllm

PLAN = Plan(mode="auto", fmt="hermes")
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
SEARCH = ('{"name": "search", "arguments": {"q": "caf\\u00e9 \\"noir\\" 日本", '
          '"tags": ["a", "b"], "n": 1.5, "deep": {"k": null, "ok": true, "l": []}}}')
# What a Hermes-format model writes: calls alone or after text, one or several, with the
# newlines Hermes/Qwen templates show, compact or spaced JSON, nested and escaped values.
TEXTS = [
    f"<tool_call>{WEATHER}</tool_call>",
    f"<tool_call>\n{WEATHER}\n</tool_call>",
    f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{SEARCH}\n</tool_call>",
    f"<tool_call>{WEATHER}</tool_call><tool_call>{SEARCH}</tool_call>",
    f"Let me look that up.\n<tool_call>\n{WEATHER}\n</tool_call>",
    f"  Checking both.\n\n<tool_call>{SEARCH}</tool_call>\n<tool_call>{WEATHER}</tool_call>\n",
    '<tool_call>{"name":"ping","arguments":{}}</tool_call>',
    '<tool_call>{"name": "f", "arguments": {"s": "a </ b > c {\\"x\\": [1]}"}}</tool_call>',
    '<tool_call>{ "name" : "f" , "arguments" : { "x" : [ 1 , 2 ] } }</tool_call>',
    "The weather in Paris is mild today.",
    "a < b and <tool is not a tag",
    "",
]
CHUNKS = [1, 2, 3, 7, 10_000]  # characters per streamed delta (tokens are 1 to ~6)


def import_vllm_parser() -> Any:
    with warnings.catch_warnings():  # torch's own deprecations, on import
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
    return Hermes2ProToolParser, ChatCompletionRequest


@pytest.fixture(scope="module")
def vllm_parser(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    parser_cls, _ = import_vllm_parser()
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    return lambda: parser_cls(tok)


@pytest.fixture(scope="module")
def request_(vllm_importable: None) -> Any:  # noqa: ARG001
    _, request_cls = import_vllm_parser()
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("get_weather", "search", "ping", "f")]
    return request_cls(model="m", messages=[{"role": "user", "content": "hi"}],
                       tools=tools, tool_choice="auto")


def whole_vllm(parser: Any, req: Any, text: str) -> tuple[str | None, list[Any]]:
    got = parser.extract_tool_calls(text, req)
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in got.tool_calls]
    return got.content, calls if got.tools_called else []


def whole_ours(text: str) -> tuple[str | None, list[Any]]:
    content, calls = tool_calls(PLAN, text)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in calls]


def pieces(text: str, n: int) -> list[str]:
    return [text[i:i + n] for i in range(0, len(text), n)] or [""]


def streamed(deltas: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, str]]]:
    """Stream deltas put together: (content, [(name, raw arguments text)] by index)."""
    content, calls = "", {}
    for d in deltas:
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            fn = tc.get("function") or {}
            if tc.get("id"):
                assert fn.get("name") and tc["index"] not in calls
                calls[tc["index"]] = [fn["name"], ""]
            calls[tc["index"]][1] += fn.get("arguments") or ""
    return content or None, [(name, args) for _, (name, args) in sorted(calls.items())]


def stream_vllm(parser: Any, req: Any, text: str, n: int) -> list[dict[str, Any]]:
    out, prev = [], ""
    for piece in pieces(text, n):
        cur = prev + piece
        msg = parser.extract_tool_calls_streaming(prev, cur, piece, [], [], [], req)
        if msg is not None:
            out.append(msg.model_dump(exclude_none=True))
        prev = cur
    return out


def stream_ours(text: str, n: int) -> list[dict[str, Any]]:
    ts = ToolStream(PLAN)
    out = [d for piece in pieces(text, n) for d in ts.feed(piece)]
    return out + ts.finish()


@pytest.mark.parametrize("text", TEXTS)
def test_whole_text_same_as_vllm(vllm_parser: Any, request_: Any, text: str) -> None:
    assert whole_ours(text) == whole_vllm(vllm_parser(), request_, text)


@pytest.mark.parametrize("n", CHUNKS)
@pytest.mark.parametrize("text", TEXTS)
def test_stream_same_as_vllm(vllm_parser: Any, request_: Any, text: str, n: int) -> None:
    """The same content and, per call, the same name and the very same arguments text; the
    stream's calls are the whole text's."""
    ours = streamed(stream_ours(text, n))
    assert ours == streamed(stream_vllm(vllm_parser(), request_, text, n))
    assert [(name, json.loads(args)) for name, args in ours[1]] == whole_ours(text)[1]


# No call can be read: the whole text is the content, as vLLM answers. Streamed, vLLM's
# parser never sends what follows the tag; tokenq's stream ends with it, so that a stream
# always adds up to the whole answer.
UNREADABLE = [
    "<tool_call>not json</tool_call>",
    'Checking.\n<tool_call>\n{"na',
    "Done. <tool",
]


@pytest.mark.parametrize("text", UNREADABLE)
def test_unreadable_call_is_content_as_in_vllm(vllm_parser: Any, request_: Any,
                                               text: str) -> None:
    assert whole_ours(text) == whole_vllm(vllm_parser(), request_, text) == (text, [])
    for n in CHUNKS:
        assert streamed(stream_ours(text, n)) == (text, [])
        content, calls = streamed(stream_vllm(vllm_parser(), request_, text, n))
        assert not calls and text.startswith(content or "")


def test_cut_call_is_kept_as_vllm_streams_it(vllm_parser: Any, request_: Any) -> None:
    """A text cut inside a call's arguments (max_tokens): vLLM's whole answer turns all of
    it into content, while its stream has already sent the call and its arguments so far.
    tokenq answers the call with those arguments (a prefix), whole and streamed alike."""
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    assert whole_vllm(vllm_parser(), request_, text) == (text, [])
    content, calls = tool_calls(PLAN, text)
    ours = (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls])
    assert ours == ("Sure.\n", [("get_weather", '{"city": "Par')])
    for n in CHUNKS:
        assert streamed(stream_ours(text, n)) == ours
        assert streamed(stream_vllm(vllm_parser(), request_, text, n)) == ours
