"""`tokenq bench scale`, part (a): SSE fan-out on one API process.

A synthetic token source stands in for a worker's engine: a child process that acquires
the jobs through the job store (shared/store.py) and hands steps to the worker's own
Publisher (workers/publisher.py), so every token goes the real way, publisher -> `append`
script -> the job's stream -> the API's shared XREAD (api/streams.py) -> SSE. It writes at
a fixed total rate, round-robin over the jobs, each token's text being the wall-clock time
the step was made: a client on the same host subtracts it from its own receive time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import redis

from tokenq.cli.bench.load import pct
from tokenq.cli.bench.scale_load import (
    Meter,
    bound,
    collector_off,
    command_costs,
    command_stats,
    post_jobs,
)
from tokenq.shared import keys
from tokenq.shared.jobs import Acquired
from tokenq.shared.redis_server import free_port
from tokenq.shared.schemas import TERMINAL_EVENTS
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore

if TYPE_CHECKING:
    from tokenq.cli.stack import Stack

SOURCE_WORKER = "bench-scale-source"
STEP_S = 0.02  # the source's step: an engine step of 20 ms
RENEW_S = 5.0  # the source keeps its leases, as a worker's heartbeat does
STEADY_EDGE_S = 1.0  # the steady p99 leaves out the run's first and last second


@dataclass
class SourceSpec:
    redis_url: str
    state_dir: str
    models_file: str
    job_ids: list[str]
    rate: float  # tokens/s, all jobs together
    seconds: float


def run_source(spec: SourceSpec, ready: MpEvent, go: MpEvent, out: Any) -> None:
    """The child process: acquire every job, wait for `go`, write tokens for `seconds`,
    end every job (`length`), put a summary on `out`."""
    from tokenq.workers.engines.base import Finished, StepOutput, TokenDelta
    from tokenq.workers.publisher import Publisher

    settings = Settings(redis_url=spec.redis_url, state_dir=Path(spec.state_dir),
                        models_file=Path(spec.models_file))
    r = redis.Redis.from_url(spec.redis_url, decode_responses=True)
    store = JobStore(r, settings)
    jobs: list[tuple[str, int]] = []
    for job_id in spec.job_ids:
        got = store.acquire(job_id, SOURCE_WORKER)
        if isinstance(got, Acquired):
            jobs.append((job_id, got.attempt))
    pub = Publisher(store)
    for job_id, attempt in jobs:
        pub.track(job_id, attempt)
    pub.start()
    renewing = threading.Event()
    renewer = threading.Thread(target=_keep_leases, args=(store, jobs, renewing),
                               daemon=True, name="bench-source-leases")
    renewer.start()
    ready.set()
    summary: dict[str, Any] = {"jobs": len(jobs), "tokens": 0, "late_max_ms": 0.0}
    if not go.wait(300) or not jobs:
        renewing.set()
        pub.stop()
        out.put(summary)
        return
    index = dict.fromkeys((j for j, _ in jobs), 0)
    steps = max(1, int(spec.seconds / STEP_S))
    per_step, carry, pos = spec.rate * STEP_S, 0.0, 0
    t0 = time.monotonic()
    for n in range(steps):
        due = t0 + n * STEP_S
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        else:
            summary["late_max_ms"] = max(summary["late_max_ms"], 1000 * (now - due))
        carry += per_step
        count, carry = int(carry), carry - int(carry)
        stamp = f"{time.time():.6f}"
        step = StepOutput()
        for _ in range(count):
            job_id, attempt = jobs[pos % len(jobs)]
            pos += 1
            i = index[job_id]
            step.tokens.append(TokenDelta(job_id, attempt, i, stamp, i))
            index[job_id] = i + 1
        summary["tokens"] += count
        pub.sink(step)
    summary["source_s"] = time.monotonic() - t0
    last = StepOutput(finished=[Finished(j, a, "length", 1, index[j]) for j, a in jobs])
    pub.sink(last)
    last.flushed.wait(120)
    renewing.set()
    renewer.join(30)
    pub.stop()
    r.close()
    out.put(summary)


def _keep_leases(store: JobStore, jobs: list[tuple[str, int]], stop: threading.Event) -> None:
    """The source's leases renewed every RENEW_S on a thread of their own, as a worker's
    heartbeat does: renewing a thousand in the step loop held a step back ~0.1 s and the
    tokens behind it (counted as the server's latency). (redis-py's client and its pool
    are shared between threads safely.)"""
    while not stop.wait(RENEW_S):
        store.renew(jobs, SOURCE_WORKER)


@dataclass
class Fanout:
    opened: int = 0
    started: int = 0  # streams that saw their job's `started` event: subscribed
    ended: int = 0
    errors: int = 0
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    received: list[float] = field(default_factory=list)  # each latency's receive time
    to_redis: list[float] = field(default_factory=list)  # made -> in the stream
    from_redis: list[float] = field(default_factory=list)  # in the stream -> at the client
    last_token: float = 0.0
    all_started: asyncio.Event = field(default_factory=asyncio.Event)


async def _client(http: httpx.AsyncClient, job_id: str, f: Fanout, total: int,
                  gate: asyncio.Semaphore) -> None:
    event, data, eid, held = "", "", "", True
    await gate.acquire()
    try:
        async with http.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
            resp.raise_for_status()
            f.opened += 1
            async for line in resp.aiter_lines():
                if line:
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        data = line[5:].strip()
                    elif line.startswith("id:"):
                        eid = line[3:].strip()
                    continue
                if not data:  # the end of a keep-alive comment
                    continue
                name, payload, event, data = event, data, "", ""
                if name == "token":
                    now = time.time()
                    made = float(json.loads(payload)["text"])
                    # The entry id is Redis' clock at XADD (ms): it splits the latency.
                    written = int(eid.partition("-")[0]) / 1000
                    f.latencies.append(now - made)
                    f.received.append(now)
                    f.to_redis.append(written - made)
                    f.from_redis.append(now - written)
                    f.tokens += 1
                    f.last_token = now
                elif name == "started":
                    if held:
                        gate.release()
                        held = False
                    f.started += 1
                    if f.started == total:
                        f.all_started.set()
                elif name in TERMINAL_EVENTS:
                    f.ended += 1
                    return
    except (httpx.HTTPError, ValueError, KeyError):
        f.errors += 1
    finally:
        if held:
            gate.release()


async def fanout(url: str, api_key: str, job_ids: list[str], on_go: Callable[[], None],
                 connect_limit_s: float, stream_limit_s: float) -> tuple[Fanout, float]:
    """Open one SSE stream per job (64 connecting at a time), call `on_go` once all are
    subscribed (or after connect_limit_s), and read them to their terminal events; the
    Fanout and the time `on_go` was called."""
    f = Fanout()
    limits = httpx.Limits(max_connections=len(job_ids) + 8, max_keepalive_connections=8)
    timeout = httpx.Timeout(30.0, read=stream_limit_s + connect_limit_s)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout,
                                 headers={"Authorization": f"Bearer {api_key}"}) as http:
        gate = asyncio.Semaphore(64)
        tasks = [asyncio.create_task(_client(http, j, f, len(job_ids), gate))
                 for j in job_ids]
        try:
            await asyncio.wait_for(f.all_started.wait(), connect_limit_s)
        except TimeoutError:
            pass
        with collector_off():
            t_go = time.time()
            on_go()
            _, pending = await asyncio.wait(tasks, timeout=stream_limit_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return f, t_go


def steady(f: Fanout, edge_s: float = STEADY_EDGE_S) -> list[float]:
    """The latencies of tokens received past the run's first and last `edge_s`. Every
    stream gets its first token within the first half second and all end in the same
    step, which no real traffic lines up so: those edges are the synthetic source's
    bursts (the API's stream ends, the source's first-token writes), the middle is the
    steady fan-out. Both figures are reported."""
    if not f.received:
        return []
    lo, hi = f.received[0] + edge_s, f.last_token - edge_s
    return [lat for t, lat in zip(f.received, f.latencies, strict=True) if lo <= t <= hi]


def start_source(spec: SourceSpec) -> tuple[Any, MpEvent, MpEvent, Any]:
    """The source process (spawned: no threads of ours are forked into it), its ready and go
    events, and the queue its summary comes back on."""
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=run_source, args=(spec, ready, go, out), daemon=True,
                       name="tokenq-bench-source")
    proc.start()
    return proc, ready, go, out


def start_relay(redis_url: str) -> tuple[subprocess.Popen[bytes], str]:
    """The minimal relay (cli/bench/relay.py) on a free loopback port, once it listens."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenq.cli.bench.relay", "--redis-url",
                             redis_url, "--port", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, f"http://127.0.0.1:{port}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the relay did not start")


def _arm(stack: Stack, key: str, meter: Meter, r: redis.Redis, say: Callable[[str], None], *,
         url: str, model: str, clients: int, rate: float, seconds: float,
         ) -> tuple[list[str], Fanout, float, dict[str, float], dict[str, Any], dict[str, Any]]:
    """`clients` jobs (POST to the API), the source acquires them, one SSE stream each from
    `url`, then `rate` tok/s for `seconds`: (ids, fan-out, wall, cores, Redis command costs,
    the source's summary)."""
    ids, codes, _ = post_jobs(stack.url, key, model, clients, 64, max_tokens=1024)
    if len(ids) < clients:
        say(f"(a) only {len(ids)} of {clients} jobs were accepted: {dict(codes)}")
    spec = SourceSpec(stack.redis_url, str(stack.settings.state_dir),
                      str(stack.settings.models_file), ids, rate, seconds)
    proc, ready, go, out = start_source(spec)
    try:
        if not ready.wait(180):
            raise RuntimeError("the token source did not start")
        meter.add("source", proc.pid)
        at_go: dict[str, float] = {}
        stats_at_go = [command_stats(r)]

        def on_go() -> None:  # the bench's own loop: one INFO round trip, then the tokens
            at_go.update(meter.snap())
            stats_at_go[0] = command_stats(r)
            go.set()

        connect_s = 30 + clients / 20
        f, t_go = asyncio.run(fanout(url, key, ids, on_go, connect_s, seconds + 120))
        wall = max(f.last_token - t_go, 1e-9)
        cores = Meter.cores(at_go, meter.snap(), wall)
        commands = command_costs(stats_at_go[0], command_stats(r))
        summary: dict[str, Any] = out.get(timeout=120)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        meter.procs.pop("source", None)
    return ids, f, wall, cores, commands, summary


def part_sse(stack: Stack, key: str, meter: Meter, r: redis.Redis, say: Callable[[str], None],
             *, model: str, clients: int, rate: float, seconds: float,
             relay: bool = True) -> dict[str, Any]:
    """Part (a): SSE fan-out from the API, then (`relay`) the same traffic from the minimal
    relay; the figures, printed and returned."""
    ids, f, wall, cores, commands, summary = _arm(
        stack, key, meter, r, say, url=stack.url, model=model, clients=clients, rate=rate,
        seconds=seconds)
    sample = ids[:50]
    pipe = r.pipeline(transaction=False)
    for j in sample:
        pipe.memory_usage(keys.job(j), samples=0)
        pipe.memory_usage(keys.job_events(j), samples=0)
    sizes = pipe.execute()
    per_job = sum(int(x or 0) for x in sizes) / max(1, len(sample))
    api_cpu_s = cores["api"] * wall
    res = {"clients": clients, "opened": f.opened, "subscribed": f.started,
           "ended": f.ended, "errors": f.errors, "tokens_written": summary["tokens"],
           "tokens_received": f.tokens, "lost": summary["tokens"] - f.tokens,
           "tok_s": f.tokens / wall, "target_tok_s": rate,
           "latency_p50_ms": 1000 * pct(f.latencies, 0.5),
           "latency_p99_ms": 1000 * pct(f.latencies, 0.99),
           "latency_max_ms": 1000 * max(f.latencies, default=float("nan")),
           "latency_steady_p99_ms": 1000 * pct(steady(f), 0.99),
           "to_redis_p50_ms": 1000 * pct(f.to_redis, 0.5),
           "to_redis_p99_ms": 1000 * pct(f.to_redis, 0.99),
           "from_redis_p50_ms": 1000 * pct(f.from_redis, 0.5),
           "from_redis_p99_ms": 1000 * pct(f.from_redis, 0.99),
           "api_cpu_s_per_1k_tok": api_cpu_s / max(f.tokens, 1) * 1000,
           "source_late_max_ms": summary["late_max_ms"], "cores": cores,
           "finished_job_bytes": per_job, "finished_job_tokens": f.tokens / max(1, f.ended),
           "redis_commands": commands}
    say(f"(a) SSE fan-out: {f.opened} streams open on one API process, {f.started} "
        f"subscribed, {f.ended} ended, {f.errors} errors; tokens written {summary['tokens']}, "
        f"received {f.tokens} (lost {res['lost']})")
    say(f"    {res['tok_s']:.0f} tok/s delivered (source set to {rate:.0f}); "
        f"worker->client latency p50 {res['latency_p50_ms']:.1f} ms, p99 "
        f"{res['latency_p99_ms']:.1f} ms (past the first and last second "
        f"{res['latency_steady_p99_ms']:.1f} ms), max {res['latency_max_ms']:.0f} ms; API CPU "
        f"{res['api_cpu_s_per_1k_tok']:.2f} s per 1,000 tokens (= cores per 1,000 tok/s); "
        f"source behind schedule at most {summary['late_max_ms']:.0f} ms")
    say(f"    split at Redis' XADD clock (ms resolution): made -> in the stream (publisher "
        f"queue, pipelined append) p50 {res['to_redis_p50_ms']:.1f} / p99 "
        f"{res['to_redis_p99_ms']:.1f} ms; stream -> client (shared XREAD, SSE, client) "
        f"p50 {res['from_redis_p50_ms']:.1f} / p99 {res['from_redis_p99_ms']:.1f} ms; API "
        f"ceiling at a full core ~{1000 / max(res['api_cpu_s_per_1k_tok'], 1e-9):.0f} tok/s")
    say("    Redis' time by command: " + "; ".join(
        f"{cmd.upper()} {c['per_s']:.0f}/s x {c['us_per_call']:.1f} us = {c['cores']:.3f} "
        "cores" for cmd, c in commands.items()) + " (the shared XREAD walks every watched "
        "stream at each wake-up)")
    say(f"    {bound(cores)}")
    if relay:
        res["relay"] = relay_arm(stack, key, meter, r, say, res, model=model, clients=clients,
                                 rate=rate, seconds=seconds)
    return res


def relay_arm(stack: Stack, key: str, meter: Meter, r: redis.Redis, say: Callable[[str], None],
              api: dict[str, Any], *, model: str, clients: int, rate: float,
              seconds: float) -> dict[str, Any]:
    """The same traffic served by the minimal relay: its CPU per 1,000 tokens, and the API's
    as a multiple of it."""
    proc, url = start_relay(stack.redis_url)
    try:
        meter.add("relay", proc.pid)
        _, f, wall, cores, _, summary = _arm(
            stack, key, meter, r, say, url=url, model=model, clients=clients, rate=rate,
            seconds=seconds)
    finally:
        meter.procs.pop("relay", None)
        proc.terminate()
        proc.wait(10)
    per_1k = cores["relay"] * wall / max(f.tokens, 1) * 1000
    res = {"tokens_written": summary["tokens"], "tokens_received": f.tokens,
           "lost": summary["tokens"] - f.tokens, "errors": f.errors,
           "latency_p50_ms": 1000 * pct(f.latencies, 0.5),
           "latency_p99_ms": 1000 * pct(f.latencies, 0.99),
           "latency_steady_p99_ms": 1000 * pct(steady(f), 0.99),
           "relay_cpu_s_per_1k_tok": per_1k,
           "api_over_relay": api["api_cpu_s_per_1k_tok"] / max(per_1k, 1e-9)}
    say(f"    the same traffic from a minimal relay (cli/bench/relay.py: pub/sub read in bulk, "
        f"one write per announcement): {f.tokens} of {summary['tokens']} tokens, p50 "
        f"{res['latency_p50_ms']:.1f} / p99 {res['latency_p99_ms']:.1f} ms (steady "
        f"{res['latency_steady_p99_ms']:.1f} ms); relay CPU "
        f"{per_1k:.3f} s per 1,000 tokens; the API costs {res['api_over_relay']:.1f}x the "
        f"relay (the API at {1 / max(res['api_over_relay'], 1e-9):.2f} of the bound)")
    return res
