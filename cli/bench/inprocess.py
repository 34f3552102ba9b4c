"""The same llama.cpp engine driven in-process with no queue: what tokenq's queue path adds.

run_inprocess: a peer of its own in `tokenq bench compare` (levels, like the others).
paired_ttft: `tokenq bench paired --pairs N`, the c=1 time to first token that the queue path
adds, measured in pairs (one job in-process, then the same-shaped job through the stack,
N times) so that the VM's drift over minutes, which moves a peer-after-peer comparison by
tens of ms, cancels out of each difference.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tokenq.cli.bench.load import SAMPLING, Level, Sample, one_job, prompt_text, request_body
from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.base import EngineRequest, StepOutput


class InProcess:
    """tokenq's llama.cpp engine in this process, fed straight from client threads: the
    engine's own figures, with no Redis, API, HTTP or worker around it."""

    def __init__(self, settings: Settings, model: str):
        from tokenq.workers.engines.llamacpp import LlamaCppEngine

        self.cfg = settings.models()[model]
        self.engine = LlamaCppEngine(self.cfg, gguf_path(self.cfg, settings.state_dir))
        self._waiters: dict[str, tuple[threading.Event, Sample]] = {}
        self._lock = threading.Lock()
        self.engine.start(self._sink)  # warms the engine up

    def _sink(self, step: StepOutput) -> None:
        step.flushed.set()  # delivered: the engine need not wait
        with self._lock:
            for t in step.tokens:
                self._waiters[t.job_id][1].tick()
            for f in step.finished:
                done, sample = self._waiters.pop(f.job_id)
                sample.ok = f.reason in ("stop", "length")
                sample.prompt_tokens = f.prompt_tokens
                sample.e2e = time.perf_counter() - sample.started
                done.set()

    def run_level(self, c: int, n: int, prompt_words: int, max_tokens: int,
                  salt: str = "") -> Level:
        """n jobs from c client threads, each sending its next job when one ends (the bench's
        prompts, as `run_level` sends them to a server)."""
        def go(i: int) -> Sample:
            job_id = f"inproc-{salt}{c}-{i}"
            done, sample = threading.Event(), Sample(ok=False)
            with self._lock:
                self._waiters[job_id] = (done, sample)
            self.engine.submit(EngineRequest(
                job_id=job_id, attempt=1, prompt=prompt_text(i, prompt_words, c, salt),
                params=_params(self.cfg, i, max_tokens)))
            done.wait(600)
            return sample

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=c) as pool:
            samples = list(pool.map(go, range(n)))
        return Level.from_samples(c, samples, time.perf_counter() - t0)

    def close(self) -> None:
        self.engine.close()


def run_inprocess(settings: Settings, model: str, levels: list[int], requests: int | None,
                  prompt_words: int, max_tokens: int) -> list[Level]:
    peer = InProcess(settings, model)
    try:
        return [peer.run_level(c, requests or max(4, 2 * c), prompt_words, max_tokens)
                for c in levels]
    finally:
        peer.close()


def _params(cfg: ModelConfig, i: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=SAMPLING["temperature"],
                          top_p=SAMPLING["top_p"], top_k=SAMPLING["top_k"],
                          repetition_penalty=1.0, seed=i, stop=cfg.stop)


def paired_ttft(settings: Settings, model: str, pairs: int, prompt_words: int,
                max_tokens: int = 16) -> dict[str, Any]:
    """TTFT of `pairs` jobs run one at a time in-process and as many through the embedded
    stack (native POST + SSE), alternating; the p50/mean of the per-pair differences. A
    pair where either side has no first token (the seed's first sample was the end of
    text) is skipped and another drawn, up to `pairs` more."""
    from tokenq.cli.stack import Stack
    from tokenq.workers.engines.llamacpp import LlamaCppEngine

    cfg = settings.models()[model]
    engine = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    first: dict[str, float] = {}
    ended: dict[str, threading.Event] = {}

    def sink(step: StepOutput) -> None:
        step.flushed.set()
        for t in step.tokens:
            first.setdefault(t.job_id, time.perf_counter())
        for f in step.finished:
            ended[f.job_id].set()

    engine.start(sink)
    stack = Stack(settings, models=[model], quiet=True,
                  scratch_redis=True).start()
    inproc: list[float] = []
    queued: list[float] = []
    skipped = 0
    try:
        stack.wait_ready()
        with httpx.Client(base_url=stack.url, timeout=600) as client:
            i = 0
            while len(inproc) < pairs and i <= 2 * pairs:
                job_id = f"paired-{i}"
                ended[job_id] = threading.Event()
                t0 = time.perf_counter()
                engine.submit(EngineRequest(job_id=job_id, attempt=1, prompt=prompt_text(
                    i, prompt_words, 1001), params=_params(cfg, i, max_tokens)))
                if not ended[job_id].wait(600):
                    raise RuntimeError(f"in-process job {i} did not end")
                sample = one_job(client, request_body(
                    model, prompt_text(i, prompt_words, 1002), max_tokens, i, cfg.stop))
                if not sample.ok:
                    raise RuntimeError(f"tokenq job {i} failed")
                if job_id not in first or not sample.tokens:
                    skipped += 1
                elif i:  # the first pair warms both paths and is dropped
                    inproc.append(first[job_id] - t0)
                    queued.append(sample.ttft)
                i += 1
    finally:
        stack.stop()
        engine.close()
    if not inproc:
        raise RuntimeError("no pair had a first token on both sides")
    diffs = [1000 * (q - p) for p, q in zip(inproc, queued, strict=True)]
    return {"model": model, "pairs": len(inproc), "skipped": skipped,
            "inprocess_ttft_p50_ms": 1000 * statistics.median(inproc),
            "tokenq_ttft_p50_ms": 1000 * statistics.median(queued),
            "added_p50_ms": statistics.median(diffs), "added_mean_ms": statistics.mean(diffs)}
