"""Post-call summaries as one OpenAI batch on the embedded stack: wall time and API memory.

    .venv/bin/python benchmarks/post_call_batch.py --lines 200 [--workers 1] [--max-tokens 160]
    .venv/bin/python benchmarks/post_call_batch.py --lines 10000 --enqueue-only

Starts Redis + API + CPU worker(s) like `tokenq up`, uploads N lines (the
transcripts of examples/post_call, cycled) through the openai SDK, creates the
batch and polls it to the end while sampling the API process's RSS. Prints
the wall time, lines/s, generated tok/s, how many summaries parse and validate
against the schema, and the API's RSS at start and at peak: the API streams
files and batch lines a chunk at a time, so its memory must not grow with N.
--enqueue-only starts no worker: it measures upload, validation and enqueueing of every
line (the API's work, and its memory) and then cancels the batch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import jsonschema
import psutil
from openai import OpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenq.cli.stack import Stack  # noqa: E402
from tokenq.shared.settings import Settings  # noqa: E402

EXAMPLE = ROOT / "examples" / "post_call"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--enqueue-only", action="store_true",
                    help="no worker: time and API memory to validate and enqueue every line")
    args = ap.parse_args()

    sys.path.insert(0, str(EXAMPLE))
    from submit_batch import SCHEMA, request_line

    calls = sorted((EXAMPLE / "transcripts").glob("*.txt"))
    lines = [request_line(f"{calls[i % len(calls)].stem}#{i}", calls[i % len(calls)].read_text(),
                          args.model, args.max_tokens) for i in range(args.lines)]
    data = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()

    # A fresh state (Redis data included) per run: a queue left by an earlier run would
    # count against the queue limit and the figures.
    state = Path(tempfile.mkdtemp(prefix="bench-batch-", dir=ROOT / ".tokenq"))
    settings = Settings(state_dir=state)
    stack = Stack(settings, workers=0 if args.enqueue_only else args.workers,
                  models=[args.model], quiet=True)
    stack.start()
    try:
        if args.enqueue_only:
            stack.wait_ready(models=[])  # the API alone
        else:
            stack.wait_ready()
        assert stack.api is not None
        api = psutil.Process(stack.api.pid)
        rss = {"start": api.memory_info().rss, "peak": api.memory_info().rss}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                rss["peak"] = max(rss["peak"], api.memory_info().rss)

        threading.Thread(target=sample, daemon=True).start()
        client = OpenAI(base_url=stack.url + "/v1", api_key="bench")
        t0 = time.monotonic()
        f = client.files.create(file=("post_call.jsonl", data), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
        if args.enqueue_only:
            code = enqueue_only(stack, client, b.id, args.lines, t0, rss, len(data))
            stop.set()
            return code
        next_report = t0 + 30
        while b.status not in ("completed", "failed", "expired", "cancelled"):
            time.sleep(1)
            b = client.batches.retrieve(b.id)
            if time.monotonic() >= next_report:  # a long run says how far it got
                next_report += 30
                rc = b.request_counts
                print(f"  {time.monotonic() - t0:5.0f} s: {b.status}, "
                      f"{rc.completed if rc else 0}/{args.lines} done", file=sys.stderr,
                      flush=True)
        wall = time.monotonic() - t0
        stop.set()
        ok = tokens = 0
        finish: dict[str, int] = {}
        if b.output_file_id:
            for raw in client.files.content(b.output_file_id).text.splitlines():
                body = json.loads(raw)["response"]["body"]
                tokens += body["usage"]["completion_tokens"]
                reason = body["choices"][0]["finish_reason"]
                finish[reason] = finish.get(reason, 0) + 1
                try:
                    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]),
                                        SCHEMA)
                    ok += 1
                except (json.JSONDecodeError, jsonschema.ValidationError):
                    pass
        mib = 1 << 20
        print(f"batch {b.status}: {b.request_counts}")
        print(f"{args.lines} lines, {args.workers} worker(s), max_tokens {args.max_tokens}: "
              f"{wall:.1f} s wall, {args.lines / wall:.2f} lines/s, {tokens / wall:.1f} "
              f"generated tok/s, {ok}/{args.lines} summaries parse and validate "
              f"(finish reasons {finish}: one cut by max_tokens is a JSON prefix)")
        print(f"API RSS: start {rss['start'] / mib:.0f} MiB, peak {rss['peak'] / mib:.0f} MiB "
              f"(+{(rss['peak'] - rss['start']) / mib:.1f} MiB); input file "
              f"{len(data) / mib:.2f} MiB")
        return 0 if b.status == "completed" else 1
    finally:
        stack.stop()
        shutil.rmtree(state, ignore_errors=True)


def enqueue_only(stack: Stack, client: OpenAI, batch_id: str, lines: int, t0: float,
                 rss: dict[str, int], size: int) -> int:
    import redis

    from tokenq.shared import keys

    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    while r.hget(keys.batch(batch_id), "enqueue_done") != "1":
        b = client.batches.retrieve(batch_id)
        if b.status in ("failed", "cancelled"):
            print(f"batch {b.status}: {b.errors}")
            return 1
        time.sleep(0.2)
    wall = time.monotonic() - t0
    queued = int(r.hget(keys.batch(batch_id), "enqueued") or 0)
    client.batches.cancel(batch_id)
    mib = 1 << 20
    print(f"{lines} lines ({size / mib:.2f} MiB) uploaded, validated and enqueued ({queued} "
          f"jobs) in {wall:.1f} s = {lines / wall:.0f} lines/s, no worker")
    print(f"API RSS: start {rss['start'] / mib:.0f} MiB, peak {rss['peak'] / mib:.0f} MiB "
          f"(+{(rss['peak'] - rss['start']) / mib:.1f} MiB)")
    return 0 if queued == lines else 1


if __name__ == "__main__":
    sys.exit(main())
