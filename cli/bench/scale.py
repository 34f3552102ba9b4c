"""`tokenq bench scale`: the queue itself, not the model.

One embedded stack (Redis, one API process; later one worker) on loopback, on the fake
engine, and four measurements:
  (a) SSE fan-out: N streams on one API process while a synthetic source writes their
      tokens through the worker's own publisher (cli/bench/scale_sse.py): worker -> client
      token latency, tokens/s delivered, API CPU per 1,000 tok/s;
  (b) POST /v1/jobs per second on one API process (then DELETE, to clean up);
  (c) Redis memory per queued and per finished job (INFO used_memory deltas);
  (d) a backlog enqueued through the Batch API, then drained by one worker on the fake
      engine, each job checked to end exactly once.
Each part says what bounds it from the CPU each process used in its window: a process near
one full core is the bound (the API's event loop and Redis are single threads), else the
machine's cores together. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import json
import resource
import secrets
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from tokenq.api.openai.batch_driver import line_job_id
from tokenq.cli.bench.scale_load import Meter, bound, post_jobs, send, used_memory
from tokenq.cli.bench.scale_sse import part_sse
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.schemas import TERMINAL_EVENTS, TERMINAL_STATES
from tokenq.shared.settings import Settings

SSE_MODEL, IDLE_MODEL, DRAIN_MODEL = "scale-sse", "scale-idle", "scale-drain"
TENANT = "bench"
Say = Callable[[str], None]


@dataclass
class ScaleConfig:
    clients: int = 1000
    token_rate: float = 2000.0  # tok/s written in all during (a)
    stream_s: float = 20.0
    posts: int = 2000
    concurrency: int = 64  # requests in flight in (b)
    backlog: int = 50_000
    backlog_tokens: int = 4
    drain_slots: int = 32
    # The drain may take this long, plus a second per 100 jobs: a slow 2-core VM drains
    # ~200 instant jobs/s, so 100,000 jobs need ~500 s
    drain_limit_s: float = 180.0
    relay: bool = True  # (a) again from the minimal relay (cli/bench/relay.py): the bound

    @classmethod
    def quick(cls) -> ScaleConfig:
        return cls(clients=20, token_rate=200.0, stream_s=3.0, posts=50, concurrency=8,
                   backlog=200, drain_limit_s=90.0)

    @classmethod
    def from_flags(cls, quick: bool, clients: int | None, token_rate: float | None,
                   posts: int | None, backlog: int | None) -> ScaleConfig:
        """`tokenq bench scale [--quick]` with the sizes given on the command line."""
        cfg = cls.quick() if quick else cls()
        return replace(cfg, clients=cfg.clients if clients is None else clients,
                       token_rate=cfg.token_rate if token_rate is None else token_rate,
                       posts=cfg.posts if posts is None else posts,
                       backlog=cfg.backlog if backlog is None else backlog)


def breakdown(r: redis.Redis, job_ids: list[str]) -> dict[str, float]:
    """Where a job's bytes are (MEMORY USAGE, mean over up to 50 jobs): its record, its
    stream, and its Celery message (kept twice while queued: in the queue and the record)."""
    sample = job_ids[:50]
    pipe = r.pipeline(transaction=False)
    for j in sample:
        pipe.memory_usage(keys.job(j), samples=0)
        pipe.memory_usage(keys.job_events(j), samples=0)
        pipe.hstrlen(keys.job(j), "msg")
    got = pipe.execute()
    n = max(1, len(sample))
    return {"record": sum(int(x or 0) for x in got[0::3]) / n,
            "stream": sum(int(x or 0) for x in got[1::3]) / n,
            "message": sum(int(x or 0) for x in got[2::3]) / n}


def part_posts(stack: Stack, cfg: ScaleConfig, key: str, meter: Meter, r: redis.Redis,
               say: Say) -> dict[str, Any]:
    m0, c0 = used_memory(r), meter.snap()
    ids, codes, wall = post_jobs(stack.url, key, IDLE_MODEL, cfg.posts, cfg.concurrency)
    cores = Meter.cores(c0, meter.snap(), wall)
    m1 = used_memory(r)
    parts = breakdown(r, ids)
    c1 = meter.snap()
    gone, _, dwall = send(stack.url, key, "DELETE", [f"/v1/jobs/{j}" for j in ids], None,
                          cfg.concurrency)
    dcores = Meter.cores(c1, meter.snap(), dwall)
    m2 = used_memory(r)
    api_ms = 1000 * cores["api"] * wall / max(1, len(ids))
    res = {"posts": cfg.posts, "accepted": len(ids), "codes": dict(codes),
           "posts_s": len(ids) / wall, "api_ms_per_post": api_ms,
           "api_ceiling_posts_s": 1000 / api_ms if api_ms else float("nan"), "cores": cores,
           "deletes_s": len(gone) / dwall, "delete_cores": dcores,
           "queued_job_bytes": (m1 - m0) / max(1, len(ids)), "queued_parts": parts,
           "cancelled_job_bytes": (m2 - m0) / max(1, len(gone))}
    say(f"(b) POST /v1/jobs: {len(ids)} of {cfg.posts} accepted ({dict(codes)}) in "
        f"{wall:.1f} s, {cfg.concurrency} in flight: {res['posts_s']:.0f} jobs/s per API "
        f"process; API CPU {api_ms:.2f} ms per POST (a full core would take "
        f"{res['api_ceiling_posts_s']:.0f}/s)")
    say(f"    {bound(cores)}")
    say(f"    cleanup DELETE /v1/jobs/{{id}}: {len(gone)} cancelled, {res['deletes_s']:.0f}/s; "
        f"{bound(dcores)}")
    return res


def upload(http: httpx.Client, lines: list[str]) -> str:
    resp = http.post("/v1/files", data={"purpose": "batch"},
                     files={"file": ("backlog.jsonl", "\n".join(lines).encode())})
    resp.raise_for_status()
    return str(resp.json()["id"])


def check_jobs(r: redis.Redis, job_ids: list[str]) -> dict[str, Any]:
    """Each job's state and its stream's terminal events, 500 jobs a round trip."""
    states: Counter[str] = Counter()
    bad = dupes = 0
    started: list[float] = []
    finished: list[float] = []
    for i in range(0, len(job_ids), 500):
        chunk = job_ids[i:i + 500]
        pipe = r.pipeline(transaction=False)
        for j in chunk:
            pipe.hmget(keys.job(j), ["state", "started_at", "finished_at", "duplicates"])
            pipe.xrange(keys.job_events(j))
        got = pipe.execute()
        for rec, events in zip(got[0::2], got[1::2], strict=True):
            state, s_at, f_at, dup = rec
            states[state or "missing"] += 1
            ends = sum(1 for _, f in events if f.get("e") in TERMINAL_EVENTS)
            if state in TERMINAL_STATES and ends != 1:
                bad += 1
            dupes += int(dup or 0)
            if s_at and f_at:
                started.append(float(s_at))
                finished.append(float(f_at))
    span = max(finished) - min(started) if finished else float("nan")
    return {"states": dict(states), "not_exactly_once": bad, "duplicates_dropped": dupes,
            "drain_span_s": span}


def part_backlog(stack: Stack, cfg: ScaleConfig, key: str, meter: Meter, r: redis.Redis,
                 say: Say) -> dict[str, Any]:
    n, per_batch = cfg.backlog, stack.settings.api.max_batch_lines
    line = {"method": "POST", "url": "/v1/completions",
            "body": {"model": DRAIN_MODEL, "prompt": "scale backlog",
                     "max_tokens": cfg.backlog_tokens}}
    lines = [json.dumps({"custom_id": f"line-{i}", **line}) for i in range(n)]
    with httpx.Client(base_url=stack.url, timeout=120,
                      headers={"Authorization": f"Bearer {key}"}) as http:
        files = [upload(http, lines[i:i + per_batch]) for i in range(0, n, per_batch)]
        m0, c0, t0 = used_memory(r), meter.snap(), time.monotonic()
        batches = [http.post("/v1/batches", json={
            "input_file_id": f, "endpoint": "/v1/completions", "completion_window": "24h"},
        ).json()["id"] for f in files]
    t_valid = t_enq = 0.0
    deadline = t0 + cfg.drain_limit_s + n / 200
    while time.monotonic() < deadline:
        hs = [r.hmget(keys.batch(b), ["status", "enqueue_done", "errors"]) for b in batches]
        if any(st == "failed" for st, _, _ in hs):
            raise RuntimeError(f"a backlog batch failed validation: {hs}")
        if not t_valid and all(st != "validating" for st, _, _ in hs):
            t_valid = time.monotonic()
        if all(done == "1" for _, done, _ in hs):
            t_enq = time.monotonic()
            break
        time.sleep(0.25)
    if not t_enq:
        say(f"(d) the backlog was not all enqueued within {deadline - t0:.0f} s; draining "
            "what was")
    enq_wall = (t_enq or time.monotonic()) - t0
    enq_cores = Meter.cores(c0, meter.snap(), enq_wall)
    m1 = used_memory(r)
    c1, t1 = meter.snap(), time.monotonic()
    stack.add_worker(DRAIN_MODEL)
    meter.add("worker", stack.worker_procs[-1][1].pid)
    c1["worker"] = 0.0
    until = t1 + cfg.drain_limit_s + n / 100
    while time.monotonic() < until:
        if all(r.hget(keys.batch(b), "status") in ("completed", "failed", "expired",
                                                   "cancelled") for b in batches):
            break
        time.sleep(0.5)
    drain_wall = time.monotonic() - t1
    drain_cores = Meter.cores(c1, meter.snap(), drain_wall)
    m2 = used_memory(r)
    per = [min(per_batch, n - i) for i in range(0, n, per_batch)]
    job_ids = [line_job_id(b, k) for b, count in zip(batches, per, strict=True)
               for k in range(1, count + 1)]
    chk = check_jobs(r, job_ids)
    succeeded = chk["states"].get("succeeded", 0)
    unfinished = sum(chk["states"].get(st, 0) for st in ("queued", "running"))
    # Lost: no record, a state that is neither live nor terminal, or not exactly one
    # terminal event. Jobs still queued or running at the drain limit are not lost.
    lost = n - unfinished - sum(chk["states"].get(st, 0) for st in TERMINAL_STATES) \
        + chk["not_exactly_once"]
    res = {"backlog": n, "batches": len(batches), "tokens_per_job": cfg.backlog_tokens,
           "validate_s": (t_valid or time.monotonic()) - t0, "enqueue_s": enq_wall,
           "enqueue_lines_s": n / enq_wall, "enqueue_cores": enq_cores,
           "drain_wall_s": drain_wall, "drain_jobs_s": succeeded / chk["drain_span_s"]
           if succeeded else 0.0, "drain_cores": drain_cores, **chk,
           "succeeded": succeeded, "unfinished": unfinished,
           "lost": lost,
           "queued_line_bytes": (m1 - m0) / n, "finished_line_bytes": (m2 - m0) / n}
    say(f"(d) backlog of {n} jobs (Batch API, {len(batches)} batch(es)) on the fake engine "
        f"({cfg.backlog_tokens} tokens a job, instant): this measures the queue, not a model")
    say(f"    enqueued in {enq_wall:.1f} s ({res['enqueue_lines_s']:.0f} lines/s; validation "
        f"pass {res['validate_s']:.1f} s of it); {bound(enq_cores)}")
    say(f"    drained by 1 worker ({cfg.drain_slots} slots): {succeeded} succeeded, "
        f"{unfinished} unfinished, {chk['not_exactly_once']} not exactly once, lost "
        f"{res['lost']}; {res['drain_jobs_s']:.0f} jobs/s over {chk['drain_span_s']:.1f} s "
        f"(first start to last end; {drain_wall:.1f} s with the worker's start); "
        f"{chk['duplicates_dropped']} redelivered copies dropped")
    say(f"    {bound(drain_cores)}")
    return res


def memory_lines(a: dict[str, Any], b: dict[str, Any], d: dict[str, Any],
                 s: Settings, say: Say) -> dict[str, Any]:
    day, q = s.result_ttl_s, b["queued_parts"]
    res = {"queued_job_bytes": b["queued_job_bytes"], "queued_parts": q,
           "cancelled_job_bytes": b["cancelled_job_bytes"],
           "queued_batch_line_bytes": d["queued_line_bytes"],
           "finished_batch_line_bytes": d["finished_line_bytes"],
           "finished_job_bytes": a["finished_job_bytes"],
           "finished_job_tokens": a["finished_job_tokens"],
           "result_ttl_s": day, "file_ttl_s": s.api.file_ttl_s}
    held = a["finished_job_bytes"] * day / 2**30
    lines_held = d["finished_line_bytes"] * s.api.file_ttl_s / 2**30
    say(f"(c) Redis memory (used_memory delta / jobs): a queued job (POST) "
        f"{b['queued_job_bytes']:.0f} B (its record {q['record']:.0f} B holding its "
        f"{q['message']:.0f}-byte Celery message, which the queue holds again; its stream "
        f"{q['stream']:.0f} B); cancelled (retained) {b['cancelled_job_bytes']:.0f} B")
    say(f"    a batch line queued {d['queued_line_bytes']:.0f} B, finished with "
        f"{d['tokens_per_job']} tokens {d['finished_line_bytes']:.0f} B; a finished job with "
        f"{a['finished_job_tokens']:.0f} tokens {a['finished_job_bytes']:.0f} B (MEMORY USAGE "
        f"of its record and stream)")
    say(f"    retention: jobs {day} s (result_ttl_s), batch lines {s.api.file_ttl_s} s "
        f"(file_ttl_s): at steady state every finished job/s holds {held:.2f} GiB, every "
        f"batch line/s {lines_held:.1f} GiB; Redis keeps it all in RAM (bound: maxmemory, "
        f"the host's memory)")
    return res


def run_scale(cfg: ScaleConfig, say: Say = print, state_dir: Path | None = None) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * cfg.clients + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    with tempfile.TemporaryDirectory(prefix="tokenq-scale-", dir=state_dir) as tmp:
        state = Path(tmp)
        fake: dict[str, Any] = {"backend": "fake", "n_ctx": 65536, "n_parallel": 1}
        models = {SSE_MODEL: fake, IDLE_MODEL: fake,
                  DRAIN_MODEL: {**fake, "n_parallel": cfg.drain_slots,
                                "fake_tokens_per_s": 1000.0}}
        (state / "models.json").write_text(json.dumps(models))
        key = secrets.token_hex(16)
        room = str(max(10_000, 2 * (cfg.backlog + cfg.posts + cfg.clients)))
        env = {"TOKENQ_API_KEYS": f"{key}:{TENANT}", "TOKENQ_API__QUEUE_LIMIT": room,
               "TOKENQ_API__TENANT_MAX_QUEUED": room,
               "TOKENQ_API__MAX_STREAMS_PER_TENANT": str(cfg.clients + 16)}
        settings = Settings(redis_url=None, state_dir=state, models_file=state / "models.json")
        stack = Stack(settings, models=list(models), quiet=True,
                      drain_timeout_s=20, env=env)
        say(f"tokenq bench scale: {asdict(cfg)}; one API process, embedded Redis (AOF on), "
            f"fake engine; limits raised for the bench: queue_limit and tenant_max_queued "
            f"{room}, max_streams_per_tenant {cfg.clients + 16}")
        try:
            stack.start_parts(worker_models=[])
            stack.wait_ready(timeout=180, models=[])
            meter = Meter()
            meter.add("api", stack.api.pid if stack.api else None)
            meter.add("redis", stack.redis.proc.pid if stack.redis and stack.redis.proc
                      else None)
            r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
            version = str(r.info("server")["redis_version"])
            say(f"Redis {version}; {psutil.cpu_count()} cores, load average "
                f"{psutil.getloadavg()[0]:.1f} at the start")
            t0 = time.monotonic()
            a = part_sse(stack, key, meter, r, say, model=SSE_MODEL, clients=cfg.clients,
                         rate=cfg.token_rate, seconds=cfg.stream_s, relay=cfg.relay)
            b = part_posts(stack, cfg, key, meter, r, say)
            d = part_backlog(stack, cfg, key, meter, r, say)
            c = memory_lines(a, b, d, settings, say)
            r.close()
        finally:
            stack.stop()
    say(f"done in {time.monotonic() - t0:.0f} s (stack stopped)")
    return {"config": asdict(cfg), "sse": a, "posts": b, "memory": c, "backlog": d,
            "cpus": psutil.cpu_count(), "loadavg_1m": psutil.getloadavg()[0],
            "redis_version": version}
