"""The first round after `tokenq up` against the rounds after it (issue 43, goal 4).

Starts `tokenq up` as a user runs it, polls a readiness route as an outside client would
(`/ready` by default: a live worker per served model; `/health`: the API process alone),
then runs `tokenq bench`'s c=8 level (32 requests, 80-word prompts, 64 tokens) ROUNDS
times and prints each round's output tok/s and TTFT, and round 1 over the median of the
others. Usage:
    .venv/bin/python benchmarks/cold_start.py [--path /ready] [--rounds 4] [--port 8077]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tokenq.cli.bench.load import run_level
from tokenq.shared.settings import Settings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", default="/ready")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--port", type=int, default=8077)
    args = ap.parse_args()
    settings = Settings()
    model = settings.default_model
    cfg = settings.models()[model]
    url = f"http://127.0.0.1:{args.port}"
    t0 = time.monotonic()
    tokenq = str(Path(sys.executable).parent / "tokenq")
    up = subprocess.Popen([tokenq, "up", "--port", str(args.port)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            try:
                if httpx.get(url + args.path, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"{args.path} not 200 after 300 s")
            time.sleep(0.1)
        print(f"{args.path} 200 after {time.monotonic() - t0:.1f} s", flush=True)
        rates = []
        for r in range(args.rounds):
            lv = run_level(url, model, 8, 32, 80, 64, stop=cfg.stop, salt=f"r{r}.")
            rates.append(lv.output_tok_s)
            print(f"round {r + 1}: {lv.output_tok_s:.1f} tok/s, TTFT p50 "
                  f"{lv.ttft_p50_ms:.0f} ms p95 {lv.ttft_p95_ms:.0f} ms", flush=True)
        if len(rates) > 1:
            print(f"round 1 / median of the others: "
                  f"{rates[0] / statistics.median(rates[1:]):.2f}x")
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(60)


if __name__ == "__main__":
    main()
