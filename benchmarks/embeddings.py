"""Embedding throughput (inputs/s) of an OpenAI-compatible /v1/embeddings server.

Sends `--inputs` distinct call-center sentences in requests of `--batch` inputs each,
from `--concurrency` clients, after one warm-up request, and prints inputs/s per batch
size. The same command measures tokenq and llama-server's --embedding mode:

    tokenq up --model all-minilm-l6-v2 --port 8011 &
    python benchmarks/embeddings.py --url http://127.0.0.1:8011 --batch 1 32
    llama-server -m .tokenq/models/all-minilm-l6-v2.gguf --embedding --pooling mean \\
        -np 32 -c 8192 -b 4096 -ub 4096 --port 8012 &
    python benchmarks/embeddings.py --url http://127.0.0.1:8012 --batch 1 32
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time

import httpx

TOPICS = ["a duplicate charge", "a late delivery", "a lost card", "an internet outage",
          "a refund request", "a cancelled subscription", "a wrong address", "a password reset"]


def texts(n: int) -> list[str]:
    return [f"Call {i}: the customer phoned about {TOPICS[i % len(TOPICS)]} on order {i * 7}, "
            f"and the agent promised an answer within {i % 5 + 1} days." for i in range(n)]


def measure(url: str, model: str, batch: int, n_inputs: int, concurrency: int) -> float:
    data = texts(n_inputs)
    chunks = [data[i:i + batch] for i in range(0, n_inputs, batch)]
    with httpx.Client(base_url=url, timeout=300) as c:
        def one(chunk: list[str]) -> int:
            r = c.post("/v1/embeddings", json={"model": model, "input": chunk})
            r.raise_for_status()
            return len(r.json()["data"])

        one(chunks[0])  # warm-up
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            done = sum(pool.map(one, chunks))
        wall = time.perf_counter() - t0
    assert done == n_inputs
    return n_inputs / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--inputs", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=1)
    a = ap.parse_args()
    for b in a.batch:
        rate = measure(a.url, a.model, b, a.inputs, a.concurrency)
        print(f"batch {b:>3}  concurrency {a.concurrency}  {a.inputs} inputs  "
              f"{rate:8.1f} inputs/s", flush=True)


if __name__ == "__main__":
    main()
