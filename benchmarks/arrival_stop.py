"""An interactive job that finds a free slot beside batch streams: submit -> first token.

tokenq's llama.cpp engine in-process (no Redis, no API): `--batch` background (batch) jobs
decode on 8 slots, kept at that count, while `--arrivals` interactive jobs (one token
each, ~30-word prompts) arrive one at a time, 0.2-0.5 s apart. Every other arrival has the
engine's arrival stop switched off (StepAbort ignores its request), so both arms see the
same engine, prompts and load. Usage:
    .venv/bin/python benchmarks/arrival_stop.py [model] [--arrivals 40] [--batch 6]
Prints, per arm, the median [min-max] and p90 of submit -> first token in ms, and how many
steps were stopped (with the stop on, at most one per arrival).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from functools import partial

from tokenq.workers.main import idle_compute_threads_sleep


def main() -> None:
    ap = argparse.ArgumentParser(description="an interactive arrival beside batch streams")
    ap.add_argument("model", nargs="?", default="gemma3-270m")
    ap.add_argument("--arrivals", type=int, default=40, help="interactive jobs (both arms)")
    ap.add_argument("--batch", type=int, default=6, help="batch jobs decoding meanwhile")
    args = ap.parse_args()
    idle_compute_threads_sleep()  # before llama.cpp loads, as the worker does

    from tokenq.cli.bench.load import prompt_text
    from tokenq.shared.schemas import SamplingParams
    from tokenq.shared.settings import Settings
    from tokenq.shared.weights import gguf_path
    from tokenq.workers.engines.base import EngineRequest, StepOutput
    from tokenq.workers.engines.llamacpp import LlamaCppEngine

    settings = Settings()
    cfg = settings.models()[args.model].model_copy(update={"n_parallel": 8})
    eng = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    first: dict[str, float] = {}
    ended: set[str] = set()
    cond = threading.Condition()

    def sink(out: StepOutput) -> None:
        out.flushed.set()
        now = time.perf_counter()
        with cond:
            for t in out.tokens:
                first.setdefault(t.job_id, now)
            ended.update(f.job_id for f in out.finished)
            cond.notify_all()

    def job(job_id: str, words: int, max_tokens: int, seed: int) -> EngineRequest:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=0.95, top_k=40,
                                seed=seed, repetition_penalty=1.0)
        return EngineRequest(job_id=job_id, attempt=1, params=params,
                             prompt=prompt_text(seed, words, 8, job_id))

    eng.start(sink)
    real_request = eng.abort.request
    stop_on = [True]

    def request(*, arrival: bool = False) -> None:
        if stop_on[0] or not arrival:
            real_request(arrival=arrival)

    eng.abort.request = request  # type: ignore[method-assign]
    batch: list[str] = []
    waits: dict[bool, list[float]] = {True: [], False: []}
    stopped = {True: 0, False: 0}
    rng = random.Random(7)
    try:
        for k in range(args.arrivals + 1):
            while sum(j not in ended for j in batch) < args.batch:  # keep the batch full
                req = job(f"batch-{len(batch)}", 120, 4000, len(batch))
                req.background = True
                eng.submit(req)
                batch.append(req.job_id)
            if k == 0:  # the batch's prompts in, every stream decoding
                time.sleep(5 + args.batch)
                continue
            stop_on[0] = k % 2 == 1
            before, job_id = eng.stopped_steps, f"interactive-{k}"
            req = job(job_id, 30, 1, 1000 + k)
            req.urgent = True
            t0 = time.perf_counter()
            eng.submit(req)
            with cond:
                cond.wait_for(partial(set.__contains__, ended, job_id), 60)
            waits[stop_on[0]].append(1000 * (first[job_id] - t0))
            stopped[stop_on[0]] += eng.stopped_steps - before
            time.sleep(rng.uniform(0.2, 0.5))
    finally:
        eng.close()
    for on in (True, False):
        v = sorted(waits[on])
        print(f"{args.model}, arrival stop {'on' if on else 'off'}: {len(v)} arrivals beside "
              f"{args.batch} batch streams, submit -> first token median "
              f"{statistics.median(v):.0f} ms [{v[0]:.0f}-{v[-1]:.0f}], "
              f"p90 {v[int(0.9 * (len(v) - 1))]:.0f} ms; {stopped[on]} steps stopped")


if __name__ == "__main__":
    main()
