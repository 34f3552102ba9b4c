"""The same llama.cpp engine driven in-process with no queue: what tokenq's queue path adds."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from cli.bench import SAMPLING, Level, Sample, prompt_text
from shared.models import gguf_path
from shared.schemas import SamplingParams
from shared.settings import Settings
from workers.engines.base import EngineRequest, StepOutput


def run_inprocess(settings: Settings, model: str, levels: list[int], requests: int | None,
                  prompt_words: int, max_tokens: int) -> list[Level]:
    from workers.engines.llamacpp import LlamaCppEngine

    cfg = settings.models()[model]
    engine = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    waiters: dict[str, tuple[threading.Event, Sample]] = {}
    lock = threading.Lock()

    def sink(step: StepOutput) -> None:
        step.flushed.set()  # delivered: the engine need not wait
        with lock:
            for t in step.tokens:
                waiters[t.job_id][1].tick()
            for f in step.finished:
                done, sample = waiters[f.job_id]
                sample.ok = f.reason in ("stop", "length")
                sample.prompt_tokens = f.prompt_tokens
                sample.e2e = time.perf_counter() - sample.started
                done.set()

    engine.start(sink)
    out = []
    try:
        for c in levels:
            n = requests or max(4, 2 * c)

            def go(i: int, c: int = c) -> Sample:
                job_id = f"inproc-{c}-{i}"
                done, sample = threading.Event(), Sample(ok=False)
                with lock:
                    waiters[job_id] = (done, sample)
                engine.submit(EngineRequest(job_id=job_id, attempt=1, prompt=prompt_text(
                    i, prompt_words, c), params=SamplingParams(
                        max_tokens=max_tokens, temperature=SAMPLING["temperature"],
                        top_p=SAMPLING["top_p"], top_k=SAMPLING["top_k"],
                        repetition_penalty=1.0, seed=i, stop=cfg.stop)))
                done.wait(600)
                return sample

            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=c) as pool:
                samples = list(pool.map(go, range(n)))
            out.append(Level.from_samples(c, samples, time.perf_counter() - t0))
    finally:
        engine.close()
    return out



