"""`tokenq soak`: Poisson arrivals at a fraction of capacity while workers are SIGKILLed
every few minutes and Redis is restarted once; at the end every submitted job must have
reached exactly one terminal state with a contiguous stream.

It runs its own embedded stack (Redis with AOF, the API, N workers) on the deterministic
fake engine by default, so capacity is known: workers x slots x tokens/s / max_tokens
jobs per second. With --model a real model is served instead and --capacity must say
how many jobs per second it sustains.
"""

from __future__ import annotations

import json
import random
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.settings import Settings

FAKE = "fake"


@dataclass
class SoakConfig:
    minutes: float
    load: float = 0.5
    workers: int = 2
    slots: int = 8
    tokens_per_s: float = 50.0
    max_tokens: int = 32
    kill_every_s: float = 120.0
    model: str | None = None  # None: the fake engine
    capacity: float | None = None  # jobs/s, required with a real model
    seed: int = 1


@dataclass
class Outcome:
    submitted: list[str] = field(default_factory=list)
    refused: int = 0  # 429/503 answers (retried)
    kills: list[float] = field(default_factory=list)
    restarts: int = 0  # workers that exited and were replaced (kills included)
    redis_restart: float | None = None


def capacity(cfg: SoakConfig) -> float:
    if cfg.model is not None:
        if not cfg.capacity:
            raise SystemExit("--capacity (jobs/s) is required with --model")
        return cfg.capacity
    return cfg.workers * cfg.slots * cfg.tokens_per_s / cfg.max_tokens


def memory(stack: Stack) -> dict[str, float]:
    """RSS in MiB of every process of the stack, by role."""
    procs: list[tuple[str, int | None]] = [("redis", stack.redis.proc.pid if stack.redis and
                                            stack.redis.proc else None),
                                           ("api", stack.api.pid if stack.api else None)]
    procs += [(f"worker[{i}]", p.pid) for i, (_, p) in enumerate(stack.worker_procs)]
    out: dict[str, float] = {}
    for name, pid in procs:
        try:
            out[name] = psutil.Process(pid).memory_info().rss / 2**20 if pid else 0.0
        except psutil.NoSuchProcess:
            out[name] = 0.0
    return out


def submit_loop(stack: Stack, cfg: SoakConfig, rate: float, until: float, out: Outcome) -> None:
    rng = random.Random(cfg.seed)
    model = cfg.model or FAKE
    body = {"model": model, "prompt": "soak", "max_tokens": cfg.max_tokens, "temperature": 0}
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        next_at = time.monotonic()
        while next_at < until:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += rng.expovariate(rate)
            while time.monotonic() < until + 60:  # a refused job is retried, not dropped
                try:
                    resp = c.post("/v1/jobs", json=body)
                except httpx.HTTPError:
                    resp = None
                if resp is not None and resp.status_code == 202:
                    out.submitted.append(resp.json()["id"])
                    break
                out.refused += 1
                time.sleep(0.5)


def chaos_loop(stack: Stack, cfg: SoakConfig, until: float, out: Outcome, t0: float) -> None:
    """SIGKILL a worker every kill_every_s (the supervisor restarts it); restart Redis once,
    halfway."""
    rng = random.Random(cfg.seed + 1)
    next_kill = t0 + min(cfg.kill_every_s, (until - t0) / 3)
    restart_at = t0 + (until - t0) / 2
    while time.monotonic() < until:
        time.sleep(0.5)
        out.restarts += stack.restart_dead_workers()
        now = time.monotonic()
        if now >= next_kill:
            live = [p for _, p in stack.worker_procs if p.poll() is None]
            if live:
                rng.choice(live).send_signal(signal.SIGKILL)
                out.kills.append(now - t0)
            next_kill = now + cfg.kill_every_s
        if out.redis_restart is None and now >= restart_at and stack.redis is not None:
            stack.redis.stop()
            time.sleep(1.0)
            stack.redis.start()
            out.redis_restart = now - t0


def check(r: redis.Redis, ids: list[str]) -> dict[str, Any]:
    """Exactly one terminal state and event per job, tokens 0..n-1 once each, output equal
    to the streamed text; queue time and TTFT from the stream's own timestamps."""
    problems: list[str] = []
    queue_s: list[float] = []
    ttft_s: list[float] = []
    states: dict[str, int] = {}
    taken_over = 0
    for job_id in ids:
        h: dict[str, str] = r.hgetall(keys.job(job_id))  # type: ignore[assignment]
        states[h.get("state", "missing")] = states.get(h.get("state", "missing"), 0) + 1
        terminal, tokens, started = [], [], []
        entries: list[Any] = r.xrange(keys.job_events(job_id))  # type: ignore[assignment]
        for entry_id, f in entries:
            ts = int(entry_id.split("-")[0]) / 1000
            if f["e"] == "token":
                tokens.append((ts, json.loads(f["d"])))
            elif f["e"] == "started":
                started.append(ts)
            elif f["e"] in ("done", "error", "cancelled"):
                terminal.append(f["e"])
        if len(terminal) != 1:
            problems.append(f"{job_id}: {len(terminal)} terminal events")
        if [d["index"] for _, d in tokens] != list(range(len(tokens))):
            problems.append(f"{job_id}: tokens not contiguous")
        if h.get("state") == "succeeded" and h.get("output") != "".join(
                d["text"] for _, d in tokens):
            problems.append(f"{job_id}: output differs from the stream")
        taken_over += len(started) > 1
        created = float(h.get("created_at", 0))
        if started:
            queue_s.append(started[0] - created)
        if tokens:
            ttft_s.append(tokens[0][0] - created)
    return {"states": states, "problems": problems, "queue_s": queue_s, "ttft_s": ttft_s,
            "taken_over": taken_over}


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 \
        else xs[0]


def run_soak(cfg: SoakConfig, say: Any = print) -> int:
    cap = capacity(cfg)
    rate = cfg.load * cap
    with tempfile.TemporaryDirectory(prefix="tokenq-soak-") as tmp:
        state = Path(tmp)
        models = {FAKE: {"backend": "fake", "n_parallel": cfg.slots, "n_ctx": 65536,
                         "fake_tokens_per_s": cfg.tokens_per_s}}
        (state / "models.json").write_text(json.dumps(models))
        settings = Settings(redis_url=None, state_dir=state, models_file=state / "models.json")
        served = [cfg.model or FAKE]
        stack = Stack(settings, workers=cfg.workers, models=served,
                      quiet=True, drain_timeout_s=20)
        stack.start()
        try:
            stack.wait_ready(timeout=300)
            mem0 = memory(stack)
            say(f"soak: {cfg.minutes:g} min, Poisson arrivals at {rate:.1f} jobs/s "
                f"({cfg.load:.0%} of {cap:.1f} jobs/s), {cfg.workers} workers x {cfg.slots} "
                f"slots, a worker SIGKILLed every {cfg.kill_every_s:.0f} s, Redis restarted once")
            out = Outcome()
            t0 = time.monotonic()
            until = t0 + cfg.minutes * 60
            submitter = threading.Thread(target=submit_loop,
                                         args=(stack, cfg, rate, until, out))
            submitter.start()
            # Chaos on the main thread: the children it (re)starts get PR_SET_PDEATHSIG,
            # which fires when the *thread* that started them ends.
            chaos_loop(stack, cfg, until, out, t0)
            submitter.join()
            r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
            drain_until = time.monotonic() + 300
            pending = list(out.submitted)
            while pending and time.monotonic() < drain_until:  # let the last jobs finish
                out.restarts += stack.restart_dead_workers()
                pipe = r.pipeline(transaction=False)
                for job_id in pending:
                    pipe.hget(keys.job(job_id), "state")
                pending = [i for i, s in zip(pending, pipe.execute(), strict=True)
                           if s in (None, "queued", "running")]
                time.sleep(0.5)
            mem1 = memory(stack)
            result = check(r, out.submitted)
            r.close()
        finally:
            stack.stop()
    n = len(out.submitted)
    unexpected = out.restarts - len(out.kills)
    ok = not result["problems"] and result["states"].get("succeeded", 0) == n \
        and unexpected == 0
    say(f"submitted {n} ({out.refused} refusals retried); terminal: {result['states']}; "
        f"exactly once: {'yes' if not result['problems'] else 'NO'}")
    for p in result["problems"][:10]:
        say(f"  {p}")
    say(f"worker kills at {', '.join(f'{k:.0f}s' for k in out.kills)}; Redis restarted at "
        f"{out.redis_restart or 0:.0f}s; {result['taken_over']} jobs taken over; "
        f"{unexpected} worker exits besides the kills")
    q, f = result["queue_s"], result["ttft_s"]
    say(f"queue time p50 {pct(q, 50) * 1000:.0f} ms, p99 {pct(q, 99) * 1000:.0f} ms; "
        f"TTFT p50 {pct(f, 50) * 1000:.0f} ms, p99 {pct(f, 99) * 1000:.0f} ms")
    say("memory (RSS MiB, start -> end; a killed worker's slot is its replacement at the end):")
    for name in mem1 | mem0:
        say(f"  {name:10s} {mem0.get(name, 0):7.1f} -> {mem1.get(name, 0):7.1f}")
    return 0 if ok else 1
