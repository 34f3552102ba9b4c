"""The llama.cpp engine's own time between two decodes: sampling and its Python.

tokenq's engine in-process (no Redis, no API), --streams jobs at a time, each 64 tokens at
temperature 0.7, top-k 40, top-p 0.95 (the bench's sampling); every `llama_decode` is
timed, and the gap from one decode's end to the next one's start is what the step costs
beyond the model. Steps with all of them decoding only. Usage:
    .venv/bin/python benchmarks/step_gap.py [model] [--omp-default] [--streams 8] [--rounds 2]
                                            [--prompt-words 80]

--prompt-words: `tokenq bench`'s prompts of that many words (~95 tokens at 80) instead of a
one-line request, so that a decode here can be set beside one timed in a running worker.

--omp-default: leave libgomp's idle spin as it is (the worker shortens it; see
`idle_compute_threads_sleep` in workers/main.py), so the sampling helper finds no free core.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
from functools import partial
from typing import Any

from tokenq.workers.main import idle_compute_threads_sleep


def main() -> None:
    parser = argparse.ArgumentParser(description="the engine's time between two decodes")
    parser.add_argument("model", nargs="?", default="gemma3-270m")
    parser.add_argument("--omp-default", action="store_true", help="libgomp's default spin")
    parser.add_argument("--streams", type=int, default=8, help="jobs at a time (slots)")
    parser.add_argument("--rounds", type=int, default=2, help="batches of --streams jobs")
    parser.add_argument("--prompt-words", type=int, default=0,
                        help="tokenq bench's prompts of this many words (0: a one-line one)")
    args = parser.parse_args()
    if not args.omp_default:
        idle_compute_threads_sleep()  # before llama.cpp loads, as the worker does
    import llama_cpp as ll

    from tokenq.cli.bench.load import prompt_text
    from tokenq.shared.schemas import SamplingParams
    from tokenq.shared.settings import Settings
    from tokenq.shared.weights import gguf_path
    from tokenq.workers.engines.base import EngineRequest, StepOutput
    from tokenq.workers.engines.llamacpp import LlamaCppEngine

    name, streams, rounds = args.model, args.streams, args.rounds
    marks: list[tuple[float, float, int]] = []
    decode = ll.llama_decode

    def timed(ctx: Any, batch: Any) -> int:
        t0 = time.perf_counter()
        rc = int(decode(ctx, batch))
        marks.append((t0, time.perf_counter(), int(batch.n_tokens)))
        return rc

    ll.llama_decode = timed
    settings = Settings()
    cfg = settings.models()[name].model_copy(update={"n_parallel": streams})
    eng = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    ended: set[str] = set()
    cond = threading.Condition()

    def sink(out: StepOutput) -> None:
        out.flushed.set()
        with cond:
            ended.update(f.job_id for f in out.finished)
            cond.notify_all()

    def all_ended(n: int) -> bool:
        return len(ended) >= n

    eng.start(sink)
    try:
        for r in range(rounds):
            for i in range(streams):
                params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.95, top_k=40,
                                        seed=i, repetition_penalty=1.0)
                job = f"j{r}.{i}"
                if args.prompt_words:  # as the bench sends it: a completion, no template
                    req = EngineRequest(job_id=job, attempt=1, params=params,
                                        prompt=prompt_text(i, args.prompt_words, streams, job))
                else:
                    req = EngineRequest(job_id=job, attempt=1, params=params, messages=[
                        {"role": "user", "content": f"Tell me a long story about the number {i}."}])
                eng.submit(req)
            with cond:
                cond.wait_for(partial(all_ended, streams * (r + 1)), timeout=600)
    finally:
        eng.close()
    full = [m for m in marks if m[2] == streams]
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(marks)
            if a[2] == streams and b[2] == streams]
    if not gaps:
        print(f"{name}: no two {streams}-stream decodes in a row (jobs ended early)")
        return
    print(f"{name}: {len(gaps)} gaps between {streams}-stream decodes: median "
          f"{statistics.median(gaps) * 1e3:.2f} ms, p90 "
          f"{sorted(gaps)[int(len(gaps) * 0.9)] * 1e3:.2f} ms; decode median "
          f"{statistics.median(m[1] - m[0] for m in full) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
