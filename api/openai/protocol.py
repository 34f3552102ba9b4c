"""OpenAI wire models: chat/completions requests, and the response/chunk objects.

A request becomes a native JobRequest (`to_job`), so it runs through the same
queue, leases and streams as a job posted to /v1/jobs. Unknown fields are
ignored the way vLLM's server ignores them; fields tokenq cannot honour
(n > 1, logprobs, tools, logit_bias, echo, suffix) are refused with a 400
rather than silently dropped.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.errors import InvalidRequest
from shared.schemas import ChatMessage, JobRecord, JobRequest, Priority, ResponseFormat

ChatEndpoint = "/v1/chat/completions"
CompletionEndpoint = "/v1/completions"
ENDPOINTS = (ChatEndpoint, CompletionEndpoint)

class StreamOptions(BaseModel):
    include_usage: bool = False

class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension; -1 = off
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    priority: Priority | None = None  # tokenq extension; batch lines run at `low`

    @model_validator(mode="after")
    def _supported(self) -> _Common:
        if self.n not in (None, 1):
            raise ValueError("n: only n=1 is supported (send several requests instead)")
        if self.logprobs:
            raise ValueError("logprobs: not supported")
        if self.logit_bias:
            raise ValueError("logit_bias: not supported")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported; use repetition_penalty")
        return self

    def _job(self, **kw: Any) -> JobRequest:
        return JobRequest(
            model=self.model, max_tokens=self.max_tokens, temperature=self.temperature,
            top_p=self.top_p, top_k=None if self.top_k == -1 else self.top_k,
            repetition_penalty=self.repetition_penalty, stop=self.stop, seed=self.seed,
            priority=self.priority or "normal", metadata=self.metadata, **kw)

class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _no_tools(self) -> ChatCompletionRequest:
        if self.tools:
            raise ValueError("tools: function calling is not supported")
        return self

    def to_job(self) -> JobRequest:
        job = self._job(messages=self.messages, response_format=self.response_format)
        if self.max_completion_tokens is not None:
            job.max_tokens = self.max_completion_tokens
        return job

class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _plain(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise ValueError("prompt: give one string (batched prompts are not supported)")
        if self.echo or self.suffix or self.best_of not in (None, 1):
            raise ValueError("echo, suffix and best_of are not supported")
        return self

    def to_job(self) -> JobRequest:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return self._job(prompt=prompt)

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

def final_response(endpoint: str, rec: JobRecord) -> dict[str, Any]:
    """The non-streaming body for a succeeded job (also a batch output line's body)."""
    created = int(rec.created_at)
    u = usage(rec.usage.prompt_tokens, rec.usage.completion_tokens) if rec.usage else usage(0, 0)
    text = rec.output or ""
    if endpoint == ChatEndpoint:
        choice: dict[str, Any] = {"index": 0, "logprobs": None,
                                  "finish_reason": rec.finish_reason or "stop",
                                  "message": {"role": "assistant", "content": text,
                                              "refusal": None}}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": rec.finish_reason or "stop"}
        obj = "text_completion"
    return {"id": response_id(endpoint, rec.id), "object": obj, "created": created,
            "model": rec.adapter or rec.model, "choices": [choice], "usage": u,
            "system_fingerprint": None}

def chunk(endpoint: str, job_id: str, model: str, created: int, *, text: str | None = None,
          role: bool = False, finish_reason: str | None = None,
          usage_: dict[str, int] | None = None) -> dict[str, Any]:
    """One streamed chunk. A usage-only chunk (include_usage) has empty choices."""
    base = {"id": response_id(endpoint, job_id), "created": created, "model": model,
            "system_fingerprint": None}
    if usage_ is not None:
        obj = "chat.completion.chunk" if endpoint == ChatEndpoint else "text_completion"
        return {**base, "object": obj, "choices": [], "usage": usage_}
    if endpoint == ChatEndpoint:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        return {**base, "object": "chat.completion.chunk", "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    return {**base, "object": "text_completion", "choices": [choice]}

def now() -> int:
    return int(time.time())

Status = Literal[400, 404, 408, 500, 503]
