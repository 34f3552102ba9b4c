"""The OpenAI request models as the official SDK fills them: an explicit null on an
optional flag is its default (as vLLM reads it), stream_options needs stream, and an
empty embedding input is refused naming its index."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tokenq.api.openai.embeddings import EmbeddingRequest
from tokenq.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    StreamOptions,
    parse,
)
from tokenq.api.openai.tokenize import TokenizeRequest
from tokenq.shared.schemas import JobRequest

MSG = [{"role": "user", "content": "hi"}]


def test_null_flags_are_their_defaults() -> None:
    chat = ChatCompletionRequest.model_validate({
        "model": "m", "messages": MSG, "stream": None, "logprobs": None,
        "parallel_tool_calls": None, "stream_options": None})
    assert chat.stream is False and chat.logprobs is False and chat.log_k() is None
    assert chat.to_job().parallel_tool_calls is None
    comp = CompletionRequest.model_validate({"model": "m", "prompt": "x", "echo": None,
                                             "stream": None})
    assert comp.echo is False and comp.stream is False
    streamed = parse("/v1/chat/completions", {
        "model": "m", "messages": MSG, "stream": True,
        "stream_options": {"include_usage": None, "continuous_usage_stats": None}})
    assert streamed.stream_options is not None
    assert streamed.stream_options.include_usage is False
    tok = TokenizeRequest.model_validate({"model": "m", "prompt": "x",
                                          "add_special_tokens": None,
                                          "add_generation_prompt": None,
                                          "return_token_strs": None})
    assert (tok.add_special_tokens, tok.add_generation_prompt, tok.return_token_strs) == (
        True, True, False)
    # a value that is not a boolean (nor null) is still refused
    with pytest.raises(ValidationError, match="stream: expected true or false"):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, "stream": "x"})


@pytest.mark.parametrize(("field", "value"), [
    ("stream", "yes"), ("stream", 1), ("logprobs", "true"), ("max_tokens", True),
    ("n", False), ("temperature", True), ("seed", True), ("top_logprobs", True),
    ("max_tokens", "5"), ("temperature", "0.5")])
def test_openai_types_not_pydantic_s_lax_reading(field: str, value: object) -> None:
    """Pydantic read `"stream": "yes"` as true and `"max_tokens": true` as 1; OpenAI's API
    refuses both, and so does this one now, naming the field."""
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, field: value})
    err = info.value.errors()[0]
    assert (err.get("ctx") or {}).get("param") == field, err
    with pytest.raises(ValidationError):
        StreamOptions.model_validate({"include_usage": "yes"})


@pytest.mark.parametrize("extra", [{}, {"stream": False}, {"stream": None}])
def test_stream_options_without_stream_is_refused_naming_it(extra: dict[str, Any]) -> None:
    for cls, body in ((ChatCompletionRequest, {"messages": MSG}),
                      (CompletionRequest, {"prompt": "x"})):
        with pytest.raises(ValidationError) as info:
            cls.model_validate({"model": "m", **body, **extra,
                                "stream_options": {"include_usage": True}})
        (err,) = info.value.errors()
        assert err["loc"] == ("stream_options",)
        assert err["msg"] == "stream_options can only be set when stream is true"
        # ... but a null one is no option at all
        assert cls.model_validate({"model": "m", **body, **extra,
                                   "stream_options": None}).stream_options is None


@pytest.mark.parametrize(("texts", "index"), [(["a", ""], 1), ([""], 0), (["", "b"], 0)])
def test_an_empty_embedding_input_is_refused_naming_its_index(texts: list[str],
                                                               index: int) -> None:
    for build in (lambda: EmbeddingRequest(model="m", input=texts),
                  lambda: JobRequest(model="m", input=texts)):
        with pytest.raises(ValidationError) as info:
            build()
        (err,) = info.value.errors()
        assert err["loc"] == ("input",)
        assert err["msg"].startswith(f"input[{index}] is empty")
    assert EmbeddingRequest(model="m", input=["a", " "]).texts() == ["a", " "]
