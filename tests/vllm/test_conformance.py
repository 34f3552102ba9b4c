"""Conformance: the same requests to tokenq (vLLM worker) and to vLLM's own OpenAI server on
the same tiny model; the answers must have the same shape (fields, types, finish reasons,
logprob structure). Values may differ. Fields only vLLM adds (its extensions beyond
OpenAI's objects) are listed in VLLM_ONLY; tokenq must have every other field vLLM has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.vllm import served
from tests.vllm.conftest import MAX_MODEL_LEN, SLOTS, TINY
from tokenq.cli.bench.compare_vllm import vllm_server_args
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import ModelConfig

pytestmark = pytest.mark.vllm

# vLLM's own extensions to OpenAI's objects, which tokenq does not produce.
VLLM_ONLY = {"prompt_logprobs", "prompt_token_ids", "kv_transfer_params", "stop_reason",
             "token_ids", "service_tier", "reasoning_content", "reasoning", "annotations",
             "audio", "function_call", "tool_calls", "prompt_tokens_details",
             "token_strs", "system_fingerprint", "prompt_text", "ec_transfer_params",
             "metrics", "routed_experts", "completion_tokens_details"}


# vLLM 0.32 constrains `required` and named tool choices in one of two ways. By default
# (VLLM_ENFORCE_STRICT_TOOL_CALLING=1) a parser with a structural-tag model (hermes) makes
# the model write its own syntax, `<tool_call>{"name": "refund", "arguments": ...}`: this
# tiny model's vocabulary cannot spell `<tool_call>` (it has no `_`), so no token is
# allowed, the masked logits' argmax is token 0 and the matcher rejects it (a 500,
# 'grammar rejected tokens [0]'); on a vocabulary that can spell it, the tag's arguments
# ignore disable_any_whitespace and the noise model writes spaces until max_tokens.
# With the variable off, vLLM constrains to the JSON schemas tokenq uses on every model
# (`[{"name", "parameters"}]`, or the named function's parameters) and parses them the
# same way: that is the behaviour compared here.
STRICT_OFF = {"VLLM_ENFORCE_STRICT_TOOL_CALLING": "0"}


@pytest.fixture(scope="session", autouse=True)
def vllm_server_boot(tiny_model: Path, state_dir: Path) -> Iterator[served.Launched]:
    """vLLM's own server, launched and not waited for. Autouse, so it is this module's
    first session fixture: it boots beside tokenq's vLLM stack (vllm_stack, set up next)
    instead of after it, ~45 s less on 2 cores. It lives to the session's end (idle:
    ~0.02 cores)."""
    port = free_port()
    cfg = ModelConfig(backend="vllm", source="hf", path=str(tiny_model),
                      max_model_len=MAX_MODEL_LEN, max_num_seqs=SLOTS,
                      disable_any_whitespace=True)
    # vLLM answers tool_choice required/named only with a tool-call parser configured.
    args = [*vllm_server_args(str(tiny_model), TINY, cfg, port), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes"]
    server = served.Launched(args, port, state_dir / "vllm-serve.log", env=STRICT_OFF)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vllm_server(vllm_server_boot: served.Launched) -> str:
    return vllm_server_boot.url


def shape(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return type(v).__name__


def diff(ours: Any, theirs: Any, path: str = "") -> list[str]:
    """Where our shape differs from vLLM's (None on either side matches anything)."""
    if ours == "NoneType" or theirs == "NoneType":
        return []
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{path}: {ours} vs object"]
        out = [f"{path}.{k}: missing" for k in theirs if k not in ours and k not in VLLM_ONLY]
        for k in theirs.keys() & ours.keys():
            out += diff(ours[k], theirs[k], f"{path}.{k}")
        return out
    if isinstance(theirs, list):
        if not isinstance(ours, list):
            return [f"{path}: {ours} vs list"]
        return diff(ours[0], theirs[0], path + "[]") if ours and theirs else []
    return [] if ours == theirs else [f"{path}: {ours} vs {theirs}"]


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(url + path, json={"model": TINY, **body}, timeout=120)
    assert r.status_code == 200, (url, path, r.text)
    return r.json()


def sse(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    import json

    chunks = []
    with httpx.stream("POST", url + path, json={"model": TINY, "stream": True, **body},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


MSG = [{"role": "user", "content": "Summarise the call."}]
# Tool calls: enums and a boolean, so the constraint alone ends the text (the tiny model's
# text is noise); one call (parallel_tool_calls false), as vLLM's `required` schema allows;
# greedy (at vLLM's default temperature 1 its server samples a token the grammar masked:
# this model's logits are scaled up).
TOOLS = [{"type": "function", "function": {"name": "refund", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["issue", "resolved"],
    "properties": {"issue": {"enum": ["refund", "delivery"]}, "resolved": {"type": "boolean"}}}}}]
TOOL_CASES: list[dict[str, Any]] = [
    {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "function": {"name": "refund"}}},
]
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 4}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 4, "logprobs": True,
                              "top_logprobs": 2, "n": 2}),
    ("/v1/completions", {"prompt": "The call", "max_tokens": 4, "logprobs": 2}),
    ("/v1/completions", {"prompt": "The call", "max_tokens": 4, "n": 2,
                         "presence_penalty": 0.5, "logit_bias": {"5": 1.0}, "min_p": 0.1}),
    ("/tokenize", {"prompt": "The call"}),
    ("/detokenize", {"tokens": [5, 6, 7]}),
]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_same_shape_as_vllm(vllm_stack: Stack, vllm_server: str, path: str,
                            body: dict[str, Any]) -> None:
    ours, theirs = post(vllm_stack.url, path, body), post(vllm_server, path, body)
    assert not diff(shape(ours), shape(theirs)), (ours, theirs)
    if "choices" in theirs:
        assert len(ours["choices"]) == len(theirs["choices"])
        assert ([c["finish_reason"] for c in ours["choices"]]
                == [c["finish_reason"] for c in theirs["choices"]])


@pytest.mark.parametrize(("path", "body"), [c for c in CASES if c[0].startswith("/v1")])
def test_same_stream_shape_as_vllm(vllm_stack: Stack, vllm_server: str, path: str,
                                   body: dict[str, Any]) -> None:
    body = {**body, "stream_options": {"include_usage": True}}
    ours, theirs = sse(vllm_stack.url, path, body), sse(vllm_server, path, body)
    # Each kind of chunk (role, content, finish, usage) has the same shape as vLLM's.
    def kinds(chunks: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in chunks:
            ch = c["choices"][0] if c["choices"] else None
            kind = ("usage" if ch is None else "finish" if ch.get("finish_reason")
                    else "role" if ch.get("delta", {}).get("role") else "content")
            out.setdefault(kind, shape(c))
        return out

    mine, vl = kinds(ours), kinds(theirs)
    assert set(mine) >= set(vl) - {"role"}, (mine.keys(), vl.keys())
    for kind in mine.keys() & vl.keys():
        assert not diff(mine[kind], vl[kind]), (kind, mine[kind], vl[kind])
    finals = sorted(c["choices"][0]["finish_reason"] for c in ours
                    if c["choices"] and c["choices"][0].get("finish_reason"))
    assert finals == sorted(c["choices"][0]["finish_reason"] for c in theirs
                            if c["choices"] and c["choices"][0].get("finish_reason"))


def tool_calls_of(chunks: list[Any]) -> list[tuple[str, Any]]:
    """A stream's tool-call deltas put together: (name, parsed arguments) per call."""
    import json

    calls: dict[int, list[str]] = {}
    for c in chunks:
        for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            if tc.get("id"):
                assert tc["type"] == "function" and tc["function"]["name"]
                calls[tc["index"]] = [tc["function"]["name"], ""]
            calls[tc["index"]][1] += tc["function"].get("arguments") or ""
    return [(name, json.loads(args)) for _, (name, args) in sorted(calls.items())]


@pytest.mark.parametrize("case", TOOL_CASES)
def test_tool_calls_match_vllm(vllm_stack: Stack, vllm_server: str, case: dict[str, Any]) -> None:
    """Tool calls, whole and streamed: the same structure, finish reason and call count as
    vLLM's own server; each stream's deltas add up to arguments that parse."""
    body = {"messages": MSG, "max_tokens": 48, "tools": TOOLS, "parallel_tool_calls": False,
            "temperature": 0, **case}
    ours, theirs = (post(u, "/v1/chat/completions", body) for u in (vllm_stack.url, vllm_server))
    mine, vl = ours["choices"][0], theirs["choices"][0]
    assert mine["finish_reason"] == vl["finish_reason"]
    assert len(mine["message"]["tool_calls"]) == len(vl["message"]["tool_calls"]) == 1
    assert not diff(shape(mine["message"]["tool_calls"]), shape(vl["message"]["tool_calls"]))
    streams = [sse(u, "/v1/chat/completions", body) for u in (vllm_stack.url, vllm_server)]
    got = [tool_calls_of(s) for s in streams]
    assert [[n for n, _ in g] for g in got] == [["refund"], ["refund"]]
    assert all(set(args) == {"issue", "resolved"} for g in got for _, args in g)
