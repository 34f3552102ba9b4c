"""OpenAI wire models: chat/completions requests, and the response/chunk objects.

A request becomes a native JobRequest (`to_job`), so it runs through the same
queue, leases and streams as a job posted to /v1/jobs. Unknown fields are
ignored and named in a warning in the log, as vLLM's server does; fields tokenq
cannot honour (echo, suffix, best_of) are refused with a 400 rather than silently
dropped. Tool calls are parsed out of the job's text here (api/openai/tool_parsers.py).
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tokenq.api.errors import InvalidRequest
from tokenq.api.openai.tool_parsers import tool_calls
from tokenq.api.openai.tools import Plan
from tokenq.shared.request_model import RequestModel
from tokenq.shared.schemas import (
    MAX_TOP_LOGPROBS,
    ChatMessage,
    JobRecord,
    JobRequest,
    LogitBias,
    Metadata,
    Priority,
    ResponseFormat,
    Seed,
    ToolChoice,
    ToolDef,
)

log = logging.getLogger(__name__)

ChatEndpoint = "/v1/chat/completions"
CompletionEndpoint = "/v1/completions"
EmbeddingsEndpoint = "/v1/embeddings"  # batch lines only: the route is api/openai/embeddings.py
ENDPOINTS = (ChatEndpoint, CompletionEndpoint, EmbeddingsEndpoint)
MAX_N = 8
# Optional flags OpenAI types boolean-or-null: an explicit null (the SDK sends
# `"stream": null` as given) is the default, as vLLM reads it; the value stays a bool.
FalseIfNull = Annotated[bool, BeforeValidator(lambda v: False if v is None else v)]
TrueIfNull = Annotated[bool, BeforeValidator(lambda v: True if v is None else v)]

class StreamOptions(RequestModel):
    include_usage: FalseIfNull = False

class _Common(RequestModel):
    # vLLM's way: accept unknown fields, ignore them and say so in the log.
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension; -1 = off
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)  # vLLM's extension
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    # Choices: n sibling jobs on the same prompt (see serving.py).
    n: int | None = Field(default=1, ge=1, le=MAX_N)
    stream: FalseIfNull = False
    stream_options: StreamOptions | None = None
    logit_bias: LogitBias | None = None
    user: str | None = None
    metadata: Metadata | None = None
    priority: Priority | None = None  # tokenq extension; batch lines run at `low`
    cache_prompt: bool | None = None  # llama-server's extension (default true)
    # tokenq's placement: a pool of the model (its name or backend), a first-token budget
    backend: str | None = Field(default=None, min_length=1, max_length=64)
    ttft_budget_ms: int | None = Field(default=None, ge=1, le=3_600_000)

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, v: StreamOptions | None, info: ValidationInfo
                       ) -> StreamOptions | None:
        # OpenAI's and vLLM's rule (a 400, not silently ignored); `stream` is validated
        # first (declared before): absent there, it was itself invalid.
        if v is not None and not info.data.get("stream", True):
            raise PydanticCustomError("value_error",
                                      "stream_options can only be set when stream is true")
        return v

    @model_validator(mode="after")
    def _supported(self) -> _Common:
        if self.model_extra:
            log.warning("The following fields were present in the request but ignored: %s",
                        sorted(self.model_extra))
            self.model_extra.clear()
        return self

    def _job(self, **kw: Any) -> JobRequest:
        return JobRequest(
            model=self.model, max_tokens=self.max_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=None if self.top_k == -1 else self.top_k,
            repetition_penalty=self.repetition_penalty, stop=self.stop, seed=self.seed,
            min_p=self.min_p, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias,
            priority=self.priority or "normal", metadata=self.metadata,
            cache_prompt=self.cache_prompt, backend=self.backend,
            ttft_budget_ms=self.ttft_budget_ms, **kw)

class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: FalseIfNull = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise PydanticCustomError("value_error", "set logprobs to true to use top_logprobs",
                                      {"param": "top_logprobs"})
        return self

    def log_k(self) -> int | None:
        """Alternatives per token for the engine; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def to_job(self) -> JobRequest:
        job = self._job(messages=self.messages, response_format=self.response_format,
                        logprobs=self.log_k(), tools=self.tools, tool_choice=self.tool_choice,
                        parallel_tool_calls=self.parallel_tool_calls)
        if self.max_completion_tokens is not None:
            job.max_tokens = self.max_completion_tokens
        return job

class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: FalseIfNull = False
    suffix: str | None = None
    best_of: int | None = None
    response_format: ResponseFormat | None = None  # vLLM accepts it on completions too
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _plain(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise PydanticCustomError("value_error", "give one string (batched prompts are "
                                      "not supported)", {"param": "prompt"})
        for name, off in (("echo", not self.echo), ("suffix", not self.suffix),
                          ("best_of", self.best_of in (None, 1))):
            if not off:
                raise PydanticCustomError("value_error", "{param} is not supported",
                                          {"param": name})
        return self

    def to_job(self) -> JobRequest:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return self._job(prompt=prompt, response_format=self.response_format,
                         logprobs=self.logprobs)

    def log_k(self) -> int | None:
        return self.logprobs

def parse(endpoint: str, body: dict[str, Any]) -> ChatCompletionRequest | CompletionRequest:
    """A body for `endpoint` (batch lines use this; routes let FastAPI do it)."""
    if endpoint == ChatEndpoint:
        return ChatCompletionRequest.model_validate(body)
    if endpoint == CompletionEndpoint:
        return CompletionRequest.model_validate(body)
    raise InvalidRequest(f"unsupported endpoint {endpoint!r}; use one of {', '.join(ENDPOINTS)}",
                         param="endpoint")

# -- responses -----------------------------------------------------------------------------
def response_id(endpoint: str, job_id: str) -> str:
    """chatcmpl-<hex> / cmpl-<hex>: the job id's hex, so a response maps back to its job."""
    hex_ = job_id.removeprefix("job_")
    return ("chatcmpl-" if endpoint == ChatEndpoint else "cmpl-") + hex_

def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Token events' logprobs entries -> a chat choice's `logprobs` (vLLM's shape)."""
    return {"content": entries}


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0) -> dict[str, Any]:
    """-> a completions choice's `logprobs`: parallel lists, text offsets from `offset`."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
    return {"text_offset": offsets, "token_logprobs": [e["logprob"] for e in entries],
            "tokens": [e["token"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries]}


def finish_reason(plan: Plan | None, called: bool, engine: str | None) -> str:
    """vLLM's (and OpenAI's) rule: `tool_calls` when auto or required called tools and the
    text ended on its own; a named function's call ends with `stop`."""
    engine = engine or "stop"
    if plan is not None and called and engine == "stop" and plan.mode != "named":
        return "tool_calls"
    return engine


def chat_message(text: str, plan: Plan | None, job_id: str | None = None
                 ) -> tuple[dict[str, Any], bool]:
    """A chat choice's message, with the tool calls parsed out of the text (and whether
    there were any; their ids follow from `job_id`)."""
    msg: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if plan is not None and plan.parses:
        msg["content"], msg["tool_calls"] = tool_calls(plan, text, job_id)
        return msg, bool(msg["tool_calls"])
    if plan is not None:
        msg["tool_calls"] = []
    return msg, False


def final_response(endpoint: str, recs: JobRecord | list[JobRecord],
                   logprobs: list[list[dict[str, Any]]] | None = None,
                   plan: Plan | None = None) -> dict[str, Any]:
    """The non-streaming body for succeeded jobs, one per choice (also a batch output line's
    body); `logprobs`: each choice's token entries, when the request asked for them;
    `plan`: the request's tool handling (None: no tools)."""
    recs = recs if isinstance(recs, list) else [recs]
    first = recs[0]
    prompt = first.usage.prompt_tokens if first.usage else 0
    u = usage(prompt, sum(r.usage.completion_tokens if r.usage else 0 for r in recs))
    choices: list[dict[str, Any]] = []
    for i, rec in enumerate(recs):
        text = rec.output or ""
        lp = logprobs[i] if logprobs is not None else None
        if endpoint == ChatEndpoint:
            msg, called = chat_message(text, plan, rec.id)
            choices.append({"index": i, "finish_reason": finish_reason(plan, called,
                                                                       rec.finish_reason),
                            "logprobs": chat_logprobs(lp) if lp is not None else None,
                            "message": msg})
        else:
            choices.append({"index": i, "text": text, "finish_reason": rec.finish_reason
                            or "stop", "logprobs": completion_logprobs(lp)
                            if lp is not None else None})
    obj = "chat.completion" if endpoint == ChatEndpoint else "text_completion"
    return {"id": response_id(endpoint, first.id), "object": obj,
            "created": int(first.created_at), "model": first.adapter or first.model,
            "choices": choices, "usage": u, "system_fingerprint": None}


def chunk(endpoint: str, job_id: str, model: str, created: int, *, text: str | None = None,
          role: bool = False, finish_reason: str | None = None,
          usage_: dict[str, int] | None = None, index: int = 0,
          logprobs: dict[str, Any] | None = None,
          delta: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed chunk. A usage-only chunk (include_usage) has empty choices."""
    base = {"id": response_id(endpoint, job_id), "created": created, "model": model,
            "system_fingerprint": None}
    if usage_ is not None:
        obj = "chat.completion.chunk" if endpoint == ChatEndpoint else "text_completion"
        return {**base, "object": obj, "choices": [], "usage": usage_}
    if endpoint == ChatEndpoint:
        delta = dict(delta or {})
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                                  "finish_reason": finish_reason}
        return {**base, "object": "chat.completion.chunk", "choices": [choice]}
    choice = {"index": index, "text": text or "", "logprobs": logprobs,
              "finish_reason": finish_reason}
    return {**base, "object": "text_completion", "choices": [choice]}


def now() -> int:
    return int(time.time())

Status = Literal[400, 404, 408, 500, 503]
