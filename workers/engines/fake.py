"""A deterministic fake engine for timing-sensitive fault tests (model backend `fake`).

It loads nothing and computes nothing: every `1 / fake_tokens_per_s` seconds it
emits the next token of every running job (one step, like a batch), so how long
a job takes is known in advance and the fault suite can kill, restart and hand
back at chosen moments. Token `i` of every job is the text `t{i} ` (token id i),
so the full text of a job is known to the test that checks it.

Prompt markers steer it (only for tests; a real model has no such switches):
  [[crash]]      SIGKILL this worker process when the job is admitted (poison job)
  [[pad=N]]      pad each token's text to N bytes (to fill a slow client's buffers)
  [[stall=S]]    stop emitting for S seconds after the first token (a hung step)
A JSON schema with a repetition over FAKE_GRAMMAR_CRASH kills the worker in
check_grammar, as llama.cpp's grammar builder does (only where the API's budgets are
lifted).

A job with a LoRA adapter gets `[name@version]` before its first token's text, so
tests of the adapter registry can see which version a job ran on; loading an
adapter only checks that its path exists.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from tokenq.shared.chat import count_tokens, prompt_text
from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.schema_budget import UNLIMITED, GrammarBudget, SchemaOverBudget, estimate
from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import ModelConfig
from tokenq.workers.engines.base import (
    EngineRequest,
    EngineStats,
    Finished,
    Sink,
    StepOutput,
    TokenDelta,
)

log = logging.getLogger(__name__)

FAKE_GRAMMAR_CRASH = 10_000  # llama.cpp: maxLength 1000 compiles, 20000 segfaults
_MARKER = re.compile(r"\[\[(crash|pad|stall)(?:=(\d+(?:\.\d+)?))?\]\]")


def token_text(i: int, pad: int = 0) -> str:
    """The text of token `i` (what the tests expect to read back)."""
    text = f"t{i} "
    return text.ljust(pad, ".") if pad > len(text) else text


def expected_output(n: int, pad: int = 0) -> str:
    return "".join(token_text(i, pad) for i in range(n))


@dataclass(eq=False)
class _Job:
    req: EngineRequest
    next_index: int
    n_prompt: int
    pad: int = 0
    stall_until: float = 0.0
    stall_s: float = 0.0


class FakeEngine:
    backend = "fake"

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self.slots = cfg.n_parallel
        self.max_model_len = cfg.n_ctx // cfg.n_parallel
        self.interval = 1.0 / max(cfg.fake_tokens_per_s, 0.001)
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._waiting: list[EngineRequest] = []
        self._active: dict[str, _Job] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sink: Sink | None = None

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> None:
        self._inbox.put(("submit", request))

    def cancel(self, job_id: str) -> None:
        self._inbox.put(("cancel", job_id))

    def check_grammar(self, params: SamplingParams) -> None:
        """As llama.cpp's grammar builder does (docs/reliability.md): a repetition past
        FAKE_GRAMMAR_CRASH (e.g. maxLength 20000) takes the whole worker down. Only a stack
        whose API budgets are lifted lets such a schema through."""
        if params.json_schema is None:
            return
        try:
            estimate(params.json_schema, GrammarBudget(
                max_repeat=FAKE_GRAMMAR_CRASH, max_depth=UNLIMITED, max_nodes=UNLIMITED,
                max_enum=UNLIMITED, max_pattern=UNLIMITED, max_size=UNLIMITED))
        except SchemaOverBudget:
            log.error("grammar over %d repetitions; killing this worker", FAKE_GRAMMAR_CRASH)
            os.kill(os.getpid(), signal.SIGKILL)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._active), waiting=len(self._waiting),
                           slots=self.slots, kv_cache_usage=len(self._active) / self.slots)

    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def load_adapter(self, ref: AdapterRef) -> int | None:
        if not os.path.exists(ref.path):
            raise FileNotFoundError(f"no adapter at {ref.path}")
        return None

    def unload_adapter(self, ref: AdapterRef) -> None:
        pass

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(("stop", None))
        if self._thread:
            self._thread.join(timeout=5)

    # -- engine thread -----------------------------------------------------------------
    def _loop(self) -> None:
        next_step = time.monotonic()
        while not self._stop.is_set():
            out = StepOutput()
            idle = not self._active and not self._waiting
            self._drain(out, timeout=0.5 if idle else max(0.0, next_step - time.monotonic()))
            self._admit(out)
            if self._active and time.monotonic() >= next_step:
                self._step(out)
                next_step = max(next_step + self.interval, time.monotonic() - self.interval)
            elif not self._active:
                next_step = time.monotonic()
            if out and self._sink:
                self._sink(out)

    def _drain(self, out: StepOutput, timeout: float) -> None:
        try:
            msg = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = msg
            if kind == "submit":
                self._waiting.append(arg)
            elif kind == "cancel":
                self._cancel(arg, out)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _cancel(self, job_id: str, out: StepOutput) -> None:
        for req in self._waiting:
            if req.job_id == job_id:
                self._waiting.remove(req)
                out.finished.append(Finished(job_id, req.attempt, "cancelled", 0, 0))
                return
        job = self._active.pop(job_id, None)
        if job is not None:
            out.finished.append(Finished(job_id, job.req.attempt, "cancelled", job.n_prompt,
                                         job.next_index))

    def _admit(self, out: StepOutput) -> None:
        while self._waiting and len(self._active) < self.slots:
            req = self._waiting.pop(0)
            text = prompt_text(req.prompt, req.messages)
            markers = {m.group(1): m.group(2) for m in _MARKER.finditer(text)}
            if "crash" in markers:
                # A poison job: take the whole worker down, as a segfaulting model would.
                log.error("job %s: [[crash]] marker; killing this worker", req.job_id)
                os.kill(os.getpid(), signal.SIGKILL)
            job = _Job(req, next_index=len(req.resume_token_ids),
                       n_prompt=count_tokens(text) + len(req.resume_token_ids),
                       pad=int(markers.get("pad") or 0),
                       stall_s=float(markers.get("stall") or 0))
            if job.next_index >= req.params.max_tokens:
                out.finished.append(Finished(req.job_id, req.attempt, "length", job.n_prompt,
                                             job.next_index))
                continue
            self._active[req.job_id] = job

    def _step(self, out: StepOutput) -> None:
        now = time.monotonic()
        for job_id, job in list(self._active.items()):
            if job.stall_until > now:
                continue
            i = job.next_index
            text = token_text(i, job.pad)
            ad = job.req.adapter
            if i == 0 and ad is not None:
                text = f"[{ad.name}@{ad.id}]{text}"
            out.tokens.append(TokenDelta(job_id, job.req.attempt, i, text, i))
            job.next_index += 1
            if i == 0 and job.stall_s:
                job.stall_until = now + job.stall_s
            if job.next_index >= job.req.params.max_tokens:
                del self._active[job_id]
                out.finished.append(Finished(job_id, job.req.attempt, "length", job.n_prompt,
                                             job.next_index))
