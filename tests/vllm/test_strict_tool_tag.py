"""Why the conformance test runs vLLM's own server with VLLM_ENFORCE_STRICT_TOOL_CALLING=0,
shown at the grammar, without an engine: with strict tool calling on (vLLM 0.32's
default) and the hermes parser, `tool_choice: required` is constrained by vLLM's hermes
structural tag, which must start with `<tool_call>`. The tiny test model's vocabulary
has no `_`, so that tag allows no first token at all: the engine's masked logits are all
-inf, the argmax is token 0 and xgrammar rejects it (vLLM's 500, 'grammar rejected
tokens [0]'). The JSON schema vLLM uses with the variable off, which tokenq uses too,
allows a first token. If this test starts failing, vLLM's tag changed: look again at
running the peer server with its defaults.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

PARAMS = {"type": "object", "additionalProperties": False, "required": ["issue", "resolved"],
          "properties": {"issue": {"enum": ["refund", "delivery"]},
                         "resolved": {"type": "boolean"}}}
TOOL: dict[str, Any] = {"type": "function", "function": {"name": "refund", "parameters": PARAMS}}


def allowed_first_tokens(tiny_model: Path, compile_: str, spec: str) -> int:
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiler = xgr.GrammarCompiler(info)
    ctx = (compiler.compile_structural_tag(spec) if compile_ == "tag"
           else compiler.compile_json_schema(spec, any_whitespace=False))
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    xgr.GrammarMatcher(ctx).fill_next_token_bitmask(bitmask)
    return sum(bin(int(word) & 0xFFFFFFFF).count("1") for word in bitmask[0].tolist())


def test_hermes_tag_allows_no_token_on_the_tiny_vocabulary(tiny_model: Path) -> None:
    with warnings.catch_warnings():  # torch's own deprecations, on import
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
        from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
        from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag

    assert Hermes2ProToolParser.structural_tag_model == "hermes"
    tag: Any = get_model_structural_tag("hermes", [ChatCompletionToolsParam.model_validate(TOOL)],
                                        "required", reasoning=False)
    assert allowed_first_tokens(tiny_model, "tag", tag.model_dump_json()) == 0
    required = {"type": "array", "minItems": 1, "maxItems": 1, "items": {
        "type": "object", "required": ["name", "parameters"],
        "properties": {"name": {"enum": ["refund"]}, "parameters": PARAMS}}}
    assert allowed_first_tokens(tiny_model, "json", json.dumps(required)) > 0
