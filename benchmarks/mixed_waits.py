"""Where an interactive job's first token waits, idle and beside a batch, from its record.

`tokenq bench mixed` reports the interactive TTFT; this splits it, per job, with the
times Redis keeps: the record's `created_at` (the API accepted it) and `started_at` (its
attempt acquired it: the wait for a slot, which under a batch is the preemption), and the
id of the first token's stream entry (Redis' clock, in ms: the engine's first step and
its write). Runs the embedded stack, `--arrivals` interactive jobs (`priority: high`,
Poisson) on an idle worker, then the same beside `--batch` low-priority jobs (those of
`tokenq bench mixed`). Usage:
    .venv/bin/python benchmarks/mixed_waits.py [model] [--batch 48] [--arrivals 16]
                                               [--batch-tokens 256] [--quick]
(model: the default model, as `tokenq bench mixed`; the figures in docs/benchmarks.md
name theirs.)
Prints, per phase, the median [min-max] and p95 of each part in ms.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import httpx
import redis

from tokenq.cli.bench.load import Sample, request_body
from tokenq.cli.bench.mixed import MixedConfig, Send, client_for, long_text, run_phase
from tokenq.cli.stack import Stack
from tokenq.client.sse import stream_events
from tokenq.shared import keys
from tokenq.shared.settings import Settings


@dataclass
class Sent:
    phase: str
    job_id: str
    posted: float  # time.time() before the POST
    first: float | None = None  # time.time() the first token reached the client


def send_to(client: httpx.Client, phase: list[str], sent: list[Sent]) -> Send:
    def send(body: dict[str, Any], priority: str) -> Sample:
        sample = Sample(ok=False, started=time.perf_counter())
        posted = time.time()
        resp = client.post("/v1/jobs", json={**body, "priority": priority})
        resp.raise_for_status()
        one = Sent(phase[0], resp.json()["id"], posted)
        for ev in stream_events(client, one.job_id, timeout=600):
            if ev.event == "token":
                if one.first is None:
                    one.first = time.time()
                sample.tick()
            elif ev.event == "done":
                sample.ok = True
            elif ev.event in ("error", "cancelled"):
                break
        if priority == "high":
            sent.append(one)
        return sample
    return send


def parts(r: redis.Redis, one: Sent) -> dict[str, float] | None:
    """The job's waits in ms, or None if it produced no token."""
    created, started = r.hmget(keys.job(one.job_id), ["created_at", "started_at"])
    entries: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
        keys.job_events(one.job_id))
    first_id = next((eid for eid, f in entries if f.get("e") == "token"), None)
    if one.first is None or not created or not started or first_id is None:
        return None
    written = int(first_id.split("-")[0]) / 1000
    c, s = float(created), float(started)
    return {"POST to record": 1000 * (c - one.posted),
            "record to acquired (slot wait)": 1000 * (s - c),
            "acquired to first token in Redis": 1000 * (written - s),
            "Redis to client": 1000 * (one.first - written),
            "TTFT": 1000 * (one.first - one.posted)}


def report(phase: str, rows: list[dict[str, float]]) -> None:
    print(f"{phase}: {len(rows)} interactive jobs")
    for name in rows[0] if rows else []:
        v = sorted(row[name] for row in rows)
        p95 = v[round(0.95 * (len(v) - 1))]
        print(f"  {name:<34} median {statistics.median(v):6.0f} "
              f"[{v[0]:.0f}-{v[-1]:.0f}]  p95 {p95:6.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description="where an interactive first token waits")
    ap.add_argument("model", nargs="?",
                    help="default: the default model (as `tokenq bench mixed`)")
    ap.add_argument("--batch", type=int, help="low-priority jobs (default 48)")
    ap.add_argument("--arrivals", type=int, help="interactive jobs (default 16)")
    ap.add_argument("--batch-tokens", type=int,
                    help="max_tokens of a batch job (default 256); with fewer batch jobs than "
                         "slots, long ones keep the batch running through the arrivals")
    ap.add_argument("--quick", action="store_true", help="a few short jobs (smoke test)")
    args = ap.parse_args()
    cfg = MixedConfig.quick() if args.quick else MixedConfig()
    cfg = replace(cfg, batch=args.batch or cfg.batch, arrivals=args.arrivals or cfg.arrivals,
                  batch_tokens=args.batch_tokens or cfg.batch_tokens)
    settings = Settings()
    model = args.model or settings.default_model
    stop = settings.models()[model].stop
    phase, sent = ["warm-up"], list[Sent]()
    stack = Stack(settings, models=[model], quiet=True).start()
    try:
        stack.wait_ready(models=[model])
        r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
        with client_for(stack.url, cfg) as client:
            send = send_to(client, phase, sent)
            send(request_body(model, long_text("warm-up", cfg.interactive_words), 4, 0, stop),
                 "high")
            phase[0] = "idle"
            run_phase(send, model, cfg, batch=False, interactive=True, tag="idle", stop=stop)
            phase[0] = f"beside {cfg.batch} batch jobs"
            run_phase(send, model, cfg, batch=True, interactive=True, tag="mixed", stop=stop)
        for name in dict.fromkeys(one.phase for one in sent if one.phase != "warm-up"):
            report(name, [p for one in sent if one.phase == name
                          if (p := parts(r, one)) is not None])
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
