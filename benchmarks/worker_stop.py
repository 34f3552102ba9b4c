"""How long an idle worker takes to exit after SIGTERM (a rollout's or a scale-in's stop).

Starts a stack as `tokenq up` does (embedded Redis, the API, one worker for the model),
runs one short job, then times the worker process from SIGTERM to its exit, RUNS times on
a fresh stack each. `--vllm` serves the model on the vLLM backend (its Hugging Face folder,
converted once, as `tokenq bench compare --vllm` does). Usage:
    .venv/bin/python benchmarks/worker_stop.py [--vllm] [--model M] [--runs 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import time

from rich.console import Console

from tokenq.cli.bench.compare_vllm import on_vllm
from tokenq.cli.stack import Stack
from tokenq.client import Client
from tokenq.shared.settings import Settings


def one_stop(settings: Settings, model: str) -> float:
    st = Stack(settings.model_copy(update={"redis_url": None}), workers=1, models=[model],
               quiet=True, scratch_redis=True)
    st.start_parts()
    try:
        st.wait_ready(timeout=600)
        with Client(st.url) as c:
            job = c.wait(c.submit(model, "Hello", max_tokens=8).id, timeout=120)
            assert job.status == "succeeded", job
        (_, worker), = st.worker_procs
        t0 = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        worker.wait(120)
        return time.monotonic() - t0
    finally:
        st.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--vllm", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    settings = Settings()
    model = args.model or settings.default_model
    if args.vllm:
        settings, _ = on_vllm(settings, model, Console())
    took = [one_stop(settings, model) for _ in range(args.runs)]
    print(f"{model} on {'vLLM' if args.vllm else 'its default backend'}: an idle worker "
          f"exited {', '.join(f'{t:.2f}' for t in took)} s after SIGTERM "
          f"(median {statistics.median(took):.2f} s)")


if __name__ == "__main__":
    main()
