"""llama.cpp embedding engine: many inputs of many jobs pooled in one llama_decode.

Part of the llama.cpp engine (with shared/vocab.py). An embedding model (BERT-like,
non-causal, mean or CLS pooling from its GGUF) has no KV cache to keep: every step
packs waiting inputs (one sequence id each, up to n_parallel sequences and n_batch
tokens, each whole: a non-causal model needs all of an input in one micro-batch, so
n_ubatch = n_batch), decodes once, and reads one pooled, L2-normalised vector per
sequence, as llama-server's --embedding does. A job ends when its last input has its
vector; its result is the vectors as base64 float32, one per input, in `output`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp as ll
import numpy as np

from tokenq.shared.lora_registry import AdapterRef
from tokenq.shared.settings import ModelConfig
from tokenq.shared.vocab import Vocab
from tokenq.workers.engines.base import EngineRequest, EngineStats, Finished, Sink, StepOutput

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    req: EngineRequest
    inputs: list[list[int]]
    vectors: list[str | None]
    next: int = 0  # first input not yet in a batch
    tokens: int = 0
    done: int = field(default=0)


class LlamaEmbedEngine:
    backend = "llama"

    def __init__(self, cfg: ModelConfig, model_path: Path):
        self.cfg = cfg
        self.model_path = model_path
        self.slots = cfg.n_parallel  # jobs in flight (Celery threads)
        self.max_model_len = cfg.n_ctx // cfg.n_parallel  # tokens of one input
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._jobs: list[_Job] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._sink: Sink | None = None
        self.ctx: Any = None

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self.vocab = Vocab(self.model_path, self.cfg, vocab_only=False)
        params = ll.llama_context_default_params()
        params.n_ctx = self.cfg.n_ctx
        params.n_batch = params.n_ubatch = self.cfg.n_batch
        params.n_seq_max = self.cfg.n_parallel
        params.embeddings = True
        threads = self.cfg.n_threads or os.cpu_count() or 1
        params.n_threads = params.n_threads_batch = threads
        ctx = ll.llama_init_from_model(self.vocab.model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create an embedding context")
        self.ctx = ctx
        self.n_embd = ll.llama_model_n_embd(self.vocab.model)
        self.batch = ll.llama_batch_init(self.cfg.n_batch, 0, 1)
        self._thread = threading.Thread(target=self._loop, name="llama-embed", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> None:
        self._inbox.put(("submit", request))

    def cancel(self, job_id: str) -> None:
        self._inbox.put(("cancel", job_id))

    def load_adapter(self, ref: AdapterRef) -> int | None:  # noqa: ARG002
        raise RuntimeError("embedding models take no LoRA adapters here")

    def unload_adapter(self, ref: AdapterRef) -> None:
        pass

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._jobs), waiting=0, slots=self.slots,
                           kv_cache_usage=0.0)

    def healthy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._inbox.put(("stop", None))
        if self._thread:
            self._thread.join(timeout=10)
        if self.ctx:
            ll.llama_batch_free(self.batch)
            ll.llama_free(self.ctx)
            self.ctx = None
            self.vocab.close()

    # -- engine thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            out = StepOutput()
            try:
                self._drain(out, block=not self._jobs)
                if self._jobs:
                    self._step(out)
            except Exception as exc:
                log.exception("embedding step failed; failing %d jobs", len(self._jobs))
                for job in self._jobs:
                    out.finished.append(Finished(job.req.job_id, job.req.attempt, "error",
                                                 job.tokens, 0, "engine_error", str(exc)))
                self._jobs.clear()
            if out and self._sink:
                self._sink(out)

    def _drain(self, out: StepOutput, block: bool) -> None:
        try:
            msg = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = msg
            if kind == "submit":
                self._admit(arg, out)
            elif kind == "cancel":
                for job in [j for j in self._jobs if j.req.job_id == arg]:
                    self._jobs.remove(job)
                    out.finished.append(Finished(arg, job.req.attempt, "cancelled", 0, 0))
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, req: EngineRequest, out: StepOutput) -> None:
        inputs = [self.vocab.tokenize(t) for t in req.inputs or []]
        n = sum(len(t) for t in inputs)
        too_long = [i for i, t in enumerate(inputs) if len(t) > self.max_model_len or not t]
        if too_long or not inputs:
            out.finished.append(Finished(
                req.job_id, req.attempt, "error", n, 0, "context_length_exceeded",
                f"input {too_long[0] if too_long else 0} is empty or over this model's "
                f"{self.max_model_len} tokens"))
            return
        self._jobs.append(_Job(req, inputs, [None] * len(inputs), tokens=n))

    def _step(self, out: StepOutput) -> None:
        """One decode over as many waiting inputs as fit, oldest job first."""
        b, n = self.batch, 0
        seqs: list[tuple[_Job, int]] = []
        for job in self._jobs:
            while job.next < len(job.inputs) and len(seqs) < self.cfg.n_parallel:
                toks = job.inputs[job.next]
                if n + len(toks) > self.cfg.n_batch:
                    break
                sid = len(seqs)
                for i, tok in enumerate(toks):
                    b.token[n], b.pos[n], b.n_seq_id[n] = tok, i, 1
                    b.seq_id[n][0], b.logits[n] = sid, 1
                    n += 1
                seqs.append((job, job.next))
                job.next += 1
        b.n_tokens = n
        rc = ll.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        for sid, (job, i) in enumerate(seqs):
            ptr = ll.llama_get_embeddings_seq(self.ctx, sid)
            vec = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float32)
            vec /= max(float(np.linalg.norm(vec)), 1e-12)
            job.vectors[i] = base64.b64encode(vec.tobytes()).decode()
            job.done += 1
        for job in [j for j in self._jobs if j.done == len(j.inputs)]:
            self._jobs.remove(job)
            out.finished.append(Finished(job.req.job_id, job.req.attempt, "stop", job.tokens,
                                         0, output=json.dumps(job.vectors)))
