"""One tenant's long prompt beside another tenant's single stream, on one llama.cpp engine.

Tenant B streams a chat reply; after its 10th token tenant A's prompt of `--prompt-words`
words arrives (~1,900 tokens at the default, inside SmolLM2's 2,048 a slot). Counted in
jobs that is a burst (as many wait for a first token as decode), and the budget used to
take the whole prompt in one step: B stood still for all of A's prefill. Now a step beside
a watched stream stops at `prefill_burst_s`. Both arms run in one process, alternating:
`--burst-s` (the default, 0.5) against none (`prefill_burst_s: null`, the old rule:
the whole prompt).

    .venv/bin/python benchmarks/prefill_burst.py [--runs 3] [--prompt-words 1400]

Prints, per arm: B's worst gap between tokens, its p50 gap, and A's time to first token
(median [min-max] over the runs).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.base import EngineRequest, StepOutput
from tokenq.workers.engines.llamacpp import LlamaCppEngine

MODEL = "smollm2-135m-instruct"
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


class Times:
    def __init__(self) -> None:
        self.tokens: dict[str, list[float]] = {}
        self.done: set[str] = set()
        self.cond = threading.Condition()

    def sink(self, step: StepOutput) -> None:
        step.flushed.set()
        now = time.perf_counter()
        with self.cond:
            for t in step.tokens:
                self.tokens.setdefault(t.job_id, []).append(now)
            self.done.update(f.job_id for f in step.finished)
            self.cond.notify_all()

    def wait(self, pred: object, timeout: float = 600) -> None:
        with self.cond:
            assert self.cond.wait_for(pred, timeout)  # type: ignore[arg-type]


def ask(job_id: str, text: str, max_tokens: int) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0,
                            repetition_penalty=1.0)
    return EngineRequest(job_id=job_id, attempt=1, params=params,
                         messages=[{"role": "user", "content": text}])


def one(eng: LlamaCppEngine, times: Times, tag: str, words: int) -> tuple[float, float, float]:
    """(B's worst gap, B's median gap, A's TTFT) in seconds."""
    b, a = f"b-{tag}", f"a-{tag}"
    eng.submit(ask(b, "Count from 1 to 100, one number a line.", 160))
    times.wait(lambda: len(times.tokens.get(b, [])) >= 10)
    rng = random.Random(tag)
    sent = time.perf_counter()
    eng.submit(ask(a, " ".join(rng.choice(WORDS) for _ in range(words)), 4))
    times.wait(lambda: {a, b} <= times.done)
    ts = times.tokens[b]
    during = [y - x for x, y in itertools.pairwise(ts) if y > sent]
    return max(during), statistics.median(during), times.tokens[a][0] - sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=1400)
    ap.add_argument("--burst-s", type=float, default=0.5)
    args = ap.parse_args()
    settings = Settings(state_dir=Path(tempfile.mkdtemp(prefix="tokenq-burst-")))
    base = settings.models()[MODEL]
    path = gguf_path(base, settings.state_dir)
    arms: dict[str, float | None] = {f"burst_s {args.burst_s:g}": args.burst_s,
                                     "whole prompt (old rule)": None}
    got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in arms}
    for run in range(args.runs):
        for name, burst in (arms.items() if run % 2 == 0 else reversed(arms.items())):
            eng = LlamaCppEngine(base.model_copy(update={"prefill_burst_s": burst}), path)
            times = Times()
            eng.start(times.sink)
            try:
                one(eng, times, f"warm-{run}", 200)  # measures the step costs first
                got[name].append(one(eng, times, f"{run}", args.prompt_words))
            finally:
                eng.close()
            print(f"run {run + 1} {name}: worst gap {got[name][-1][0]:.2f} s, "
                  f"A's TTFT {got[name][-1][2]:.2f} s", flush=True)

    def fmt(xs: list[float], unit: str = "s") -> str:
        return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}] {unit}"

    for name, rows in got.items():
        print(f"{name}: B's worst gap {fmt([r[0] for r in rows])}, median gap "
              f"{fmt([1000 * r[1] for r in rows], 'ms')}, A's TTFT {fmt([r[2] for r in rows])}")


if __name__ == "__main__":
    main()
