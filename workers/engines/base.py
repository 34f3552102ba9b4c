"""The engine interface: jobs go in with submit(), token deltas come out through a sink.

An engine runs its own loop (thread or event loop). Once per engine step it
hands the sink one StepOutput holding every in-flight job's new tokens and the
jobs that finished, so the publisher writes one Redis pipeline per step, not
one round trip per token per job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.schemas import SamplingParams

EndReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(slots=True)
class EngineRequest:
    job_id: str
    attempt: int
    params: SamplingParams
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None  # for a template that renders tools itself
    # Tokens already streamed by an earlier attempt (resume without gap or duplicate).
    resume_token_ids: list[int] = field(default_factory=list)
    # LoRA adapter version pinned when the job was submitted; None = the base model.
    adapter: AdapterRef | None = None
    # An embedding job: the texts to embed (prompt and messages are then None).
    inputs: list[str] | None = None
    # An interactive job (priority high): its prompt goes into the next step whole, ahead
    # of other prompts, rather than in chunks sized to keep decoding streams smooth.
    urgent: bool = False
    # A batch job (priority low): its prompt is only ever prefilled in bounded chunks, never
    # whole in one long step, so a step that runs while an interactive job arrives ends soon.
    background: bool = False


@dataclass(slots=True)
class TokenDelta:
    job_id: str
    attempt: int
    index: int
    text: str
    token_id: int
    logprobs: dict[str, Any] | None = None  # workers/engines/logprobs.entry, when asked


@dataclass(slots=True)
class Finished:
    job_id: str
    attempt: int
    reason: EndReason
    prompt_tokens: int
    completion_tokens: int
    error_code: str | None = None
    error_message: str | None = None
    # The job's result when it is not its token text (an embedding job's vectors, JSON).
    output: str | None = None


@dataclass(slots=True)
class StepOutput:
    tokens: list[TokenDelta] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    # Some job's first token is in this step: the engine may wait for `flushed` (set by
    # the sink's owner once the step is in Redis) before its next step.
    first_token: bool = False
    flushed: threading.Event = field(default_factory=threading.Event)

    def __bool__(self) -> bool:
        return bool(self.tokens or self.finished)


Sink = Callable[[StepOutput], None]


@dataclass(slots=True)
class EngineStats:
    running: int
    waiting: int
    slots: int
    kv_cache_usage: float
    # Prompt tokens whose KV was reused from a slot's cache / all prompt tokens admitted.
    prefix_hit_ratio: float = 0.0
    # Steps stopped under way for an interactive job (one a preemption freed a slot for,
    # or one that found a free slot beside batch rows alone); their rows are computed
    # again in a later step, so this counts work the batch lost.
    stopped_steps: int = 0


class Engine(Protocol):
    """What a worker needs from an inference engine.

    An engine that compiles JSON-schema grammars in its own process may also have
    `check_grammar(params: SamplingParams) -> None`: compile the job's grammar once on
    the caller's thread (workers/tasks.guard_grammar marks the job meanwhile, so a
    grammar that crashes the process fails its job as poison instead of killing the
    next worker). One that batches steps itself may have `hold(seconds: float) -> None`:
    a preemption freed a slot for a job on its way; stop the step under way if it can,
    and start no step without that job meanwhile (workers/preempt.py)."""

    backend: str
    slots: int
    max_model_len: int  # tokens one job may use (prompt + output); known once started

    def start(self, sink: Sink) -> None:
        """Load the model and start the engine loop; outputs go to `sink`."""

    def submit(self, request: EngineRequest) -> None:
        """Queue a job; it joins the running batch at the next step."""

    def cancel(self, job_id: str) -> None:
        """Abort a job; its Finished(reason='cancelled') follows within a step."""

    def stats(self) -> EngineStats:
        """Running/waiting jobs and KV cache use, for heartbeats and metrics."""

    def healthy(self) -> bool:
        """False once the engine loop has died; its jobs will never finish here."""

    def load_adapter(self, ref: AdapterRef) -> int | None:
        """Load this LoRA version now (blocking) so jobs naming it start without a load;
        returns its rank when the engine knows it. Raises when it cannot be loaded.
        A job naming a version that is not loaded loads it on admission."""

    def unload_adapter(self, ref: AdapterRef) -> None:
        """No new job will get this version from the registry: free it as soon as no job
        in flight uses it."""

    def close(self) -> None:
        """Stop the loop and free the model."""
