"""Wire models: the job request, the job record, the SSE event names, and the records
that cross between processes through Redis (the job spec, the worker heartbeat)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.request_model import RequestModel

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "expired"})
Priority = Literal["high", "normal", "low"]
FinishReason = Literal["stop", "length"]
MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs bound and vLLM's default max_logprobs
MAX_EMBED_INPUTS = 2048  # OpenAI's bound on inputs per embeddings request

# SSE event names: what clients see in `event:` lines, in this order per attempt.
# `queued`, `started` and `token` events are written by the Lua scripts and the publisher.
EVENT_DONE = "done"
EVENT_ERROR = "error"
EVENT_CANCELLED = "cancelled"
TERMINAL_EVENTS: frozenset[str] = frozenset({EVENT_DONE, EVENT_ERROR, EVENT_CANCELLED})


def _bias_entries(v: dict[str, float]) -> dict[str, float]:
    for k, bias in v.items():
        if not k.isdigit():
            raise ValueError(f"logit_bias keys are token ids; {k!r} is not one")
        if not -100.0 <= bias <= 100.0:
            raise ValueError(f"logit_bias values are in [-100, 100]; got {bias}")
    return v


# OpenAI's shape: token id (as a string) -> bias in [-100, 100]; at most 300 entries.
LogitBias = Annotated[dict[str, float], Field(max_length=300), AfterValidator(_bias_entries)]


def no_empty_texts(texts: list[str]) -> list[str]:
    """Embedding inputs: an empty one is refused naming its index (not a context error)."""
    for i, text in enumerate(texts):
        if not text:
            raise PydanticCustomError("value_error", "input[{i}] is empty", {"i": i})
    return texts


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call in an assistant message of the history (OpenAI's shape)."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    # None only on an assistant message that carries tool_calls (OpenAI's rule).
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, max_length=256)  # role `tool`
    name: str | None = Field(default=None, max_length=64)

    @field_validator("content")
    @classmethod
    def _flatten_parts(cls, v: str | list[dict[str, Any]] | None
                       ) -> str | list[dict[str, Any]] | None:
        if v is None or isinstance(v, str):
            return v
        texts = []
        for part in v:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)

    @model_validator(mode="after")
    def _roles(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs 'content'")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs 'tool_call_id'")
        return self

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else ""


class FunctionDef(RequestModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = Field(default=None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    """One entry of `tools` (OpenAI's shape; only functions exist)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


def _metadata_sizes(v: dict[str, str]) -> dict[str, str]:
    if any(len(k) > 64 or len(x) > 512 for k, x in v.items()):
        raise ValueError("metadata keys are at most 64 characters, values at most 512")
    return v


# OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512 (jobs, chat and
# completions, embeddings, batches: every request that takes metadata).
Metadata = Annotated[dict[str, str], Field(max_length=16), AfterValidator(_metadata_sizes)]
# Engines take a 64-bit seed; a bigger number is an error here, not a crash there.
Seed = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)]


class SamplingParams(BaseModel):
    """What an engine needs besides the prompt; defaults are filled from the model config."""

    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = Field(default_factory=dict)  # token id -> added to its logit
    # Per-token logprobs with this many alternatives (0: the sampled token's only);
    # None: none. Token events then carry a `logprobs` object.
    logprobs: int | None = None
    # Structured output: the JSON schema the text must satisfy ({"type": "object"} for
    # response_format json_object). llama.cpp turns it into a grammar, vLLM into
    # structured-output params. None = free text.
    json_schema: dict[str, Any] | None = None
    # llama-server's `cache_prompt`: False = prefill this job's prompt afresh (no cached
    # prefix reused), so a greedy job gives the same text whatever ran before it.
    cache_prompt: bool = True


class JobRequest(RequestModel):
    """Body of POST /v1/jobs. Exactly one of `prompt` and `messages`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # An embedding job (an `embedding: true` model): the texts to embed.
    input: Annotated[list[str], AfterValidator(no_empty_texts)] | None = Field(
        default=None, min_length=1, max_length=MAX_EMBED_INPUTS)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: LogitBias | None = None
    # Token events carry the sampled token's logprob and this many alternatives (0-20).
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    stop: str | list[str] | None = None
    seed: Seed | None = None
    priority: Priority = "normal"
    response_format: ResponseFormat | None = None
    # llama-server's name and default: reuse a cached prompt prefix (llama.cpp engine).
    cache_prompt: bool | None = None
    # Tool calling (chat only): checked by api/openai/tools.py; the job's text is what
    # the model wrote, which the OpenAI layer parses into tool calls.
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: Metadata | None = None
    # Unix time after which the job must not start: still queued then, it ends `expired`.
    deadline: float | None = Field(default=None, gt=0)
    # Placement (docs/scheduling.md): run on this pool of the model (a pool's name or its
    # backend: `llama`, `vllm`), and/or be refused at once (503 budget_unreachable) when no
    # pool is estimated to give the first token within this many milliseconds.
    backend: str | None = Field(default=None, min_length=1, max_length=64)
    ttft_budget_ms: int | None = Field(default=None, ge=1, le=3_600_000)

    @model_validator(mode="after")
    def _one_input(self) -> JobRequest:
        if sum(x is not None for x in (self.prompt, self.messages, self.input)) != 1:
            raise PydanticCustomError("value_error", "give exactly one of 'prompt' and "
                                      "'messages' (or 'input' for an embedding model)",
                                      {"param": "prompt" if self.prompt is not None
                                       else "messages"})
        if self.messages is not None and not self.messages:
            raise PydanticCustomError("value_error", "'messages' must not be empty",
                                      {"param": "messages"})
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class JobAccepted(BaseModel):
    id: str
    object: Literal["job"] = "job"
    status: JobState = "queued"
    model: str
    created_at: float
    stream_url: str
    # jobs taken before it and seconds until it starts, estimated (docs/scheduling.md)
    position: int | None = None
    eta_s: float | None = None


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class JobErrorInfo(BaseModel):
    code: str
    message: str


class JobRecord(BaseModel):
    """GET /v1/jobs/{id}: the record as stored in the Redis hash tokenq:job:{id}."""

    id: str
    object: Literal["job"] = "job"
    owner: str
    model: str
    backend: str
    # The model's pool it was placed on (a model served by several: `model@pool`), and
    # the estimates placement chose by: pool -> [first token, finish] seconds from submit.
    pool: str | None = None
    placement: dict[str, list[float]] | None = None
    # Where it was placed, when it moved while queued to a pool that finished it sooner
    # (workers/rebalance.py); `pool` is where it ran.
    moved_from: str | None = None
    priority: Priority
    # The job's state on the wire (as in the 202 and OpenAI's objects); the Redis hash
    # keeps it in its field `state`.
    status: JobState
    attempts: int
    # attempts that ended preempted for a higher-priority job (not counted as failures)
    preemptions: int = 0
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    output: str | None = None
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: JobErrorInfo | None = None
    cancel_requested: bool = False
    metadata: dict[str, str] | None = None
    # LoRA adapter the job runs with (`model` is then its base) and its registry version.
    adapter: str | None = None
    adapter_version: int | None = None
    # A job with tools: how its text holds the calls (`generic` JSON or `hermes` blocks);
    # with `request` (tools, tool_choice) that is enough to read them back out of `output`.
    tool_format: str | None = None
    request: dict[str, Any]
    # A queued job: jobs taken before it, seconds until it starts (estimated) and why it
    # waits (`waiting`; `loading` while its model loads). None once it has started.
    position: int | None = None
    eta_s: float | None = None
    reason: str | None = None

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> JobRecord:
        def opt_float(k: str) -> float | None:
            return float(h[k]) if h.get(k) else None

        return cls(
            id=h["id"],
            owner=h.get("owner", ""),
            model=h["model"],
            backend=h.get("backend", ""),
            pool=h.get("pool") or None,
            placement=json.loads(h["placement"]) if h.get("placement") else None,
            moved_from=h.get("moved_from") or None,
            priority=h.get("priority", "normal"),  # type: ignore[arg-type]
            status=h["state"],  # type: ignore[arg-type]
            attempts=int(h.get("attempts", 0)),
            preemptions=int(h.get("preemptions", 0)),
            created_at=float(h["created_at"]),
            started_at=opt_float("started_at"),
            finished_at=opt_float("finished_at"),
            worker=h.get("worker") or None,
            output=h.get("output"),
            finish_reason=h.get("finish_reason") or None,  # type: ignore[arg-type]
            usage=Usage.model_validate_json(h["usage"]) if h.get("usage") else None,
            error=JobErrorInfo.model_validate_json(h["error"]) if h.get("error") else None,
            cancel_requested=h.get("cancel_requested") == "1",
            metadata=json.loads(h["metadata"]) if h.get("metadata") else None,
            adapter=h.get("adapter") or None,
            adapter_version=int(h["adapter_version"]) if h.get("adapter_version") else None,
            tool_format=h.get("tool_format") or None,
            request=_request(h),
        )


def _request(h: Mapping[str, str]) -> dict[str, Any]:
    """The record's request, with its response schema taken back from the spec (where it
    is stored, once)."""
    req: dict[str, Any] = json.loads(h["request"])
    fmt = req.get("response_format")
    js = fmt.get("json_schema") if isinstance(fmt, dict) else None
    if isinstance(js, dict) and "schema" not in js and h.get("spec"):
        js["schema"] = json.loads(h["spec"]).get("params", {}).get("json_schema")
    return req


class JobSpec(BaseModel):
    """What a worker needs to run a job: written by the API into the record's `spec`
    when the job is created, read by the worker that acquires it."""

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    inputs: list[str] | None = None  # an embedding job's texts (one vector each)
    # Passed to a chat template that renders tools itself (`tools` in its Jinja); None
    # when there are none or the API already wrote them into the messages.
    tools: list[dict[str, Any]] | None = None
    params: SamplingParams
    # The adapter version pinned at submit (a later unload or rollback does not change
    # what this job runs on); None: the base model.
    adapter: AdapterRef | None = None


class Pace(BaseModel):
    """A worker's measured service: moving averages over its jobs that ended (placement,
    api/placement.py). Times from a job's start on the worker."""

    jobs: int  # jobs measured so far
    job_s: float  # start to end
    first_token_s: float  # start to first token
    decode_tps: float  # one stream's tokens per second after its first
    prompt_tps: float  # prompt tokens per second of first-token time


class WorkerHeartbeat(BaseModel):
    """A worker's entry in `tokenq:workers`, rewritten every heartbeat_s."""

    model: str
    backend: str
    slots: int
    running: int
    waiting: int
    kv_cache_usage: float = 0.0
    prefix_hit_ratio: float = 0.0
    max_model_len: int | None = None  # what one request may use, as its engine reports
    metrics_port: int | None = None  # its engine metrics (Prometheus), None: not served
    metrics_host: str = ""
    ts: float  # Unix time of the beat
    pid: int = 0
    adapters: dict[str, int] = Field(default_factory=dict)  # adapter name -> version id
    pool: str = ""  # its queues' name: the model, or `model@pool` (placement)
    pace: Pace | None = None  # its measured service, once a job finished


def live_workers(raw: Mapping[str, str], ttl_s: float,
                 now: float | None = None) -> dict[str, WorkerHeartbeat]:
    """The heartbeats (HGETALL tokenq:workers) of workers that beat within `ttl_s`, by
    worker id. A worker that stopped beating that long ago is gone (killed, or its
    engine died); one that was only paused comes back with its next beat."""
    cutoff = (time.time() if now is None else now) - ttl_s
    beats = {wid: WorkerHeartbeat.model_validate_json(v) for wid, v in raw.items()}
    return {wid: hb for wid, hb in sorted(beats.items()) if hb.ts >= cutoff}
