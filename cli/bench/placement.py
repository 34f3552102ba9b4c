"""`tokenq bench placement`: placement across a model's pools (docs/scheduling.md) against
the fast pool alone.

One stack on the fake engine per run: one model served by two pools, a "fast" one (say a
GPU pool: `fast_slots` slots at `fast_rate` tokens/s per job) and a "slow" one (a CPU pool:
`slow_slots` at `slow_rate`), one worker each. Both pools are measured first (a few pinned
jobs each: the workers' pace). Then two arms, in turn (their order alternates between
runs), each a burst of `burst` jobs submitted at once: "placed" (no pin: placement chooses)
and "fast alone" (every job pinned to the fast pool).

Figures per arm: rejections, TTFT p50/p95 (created -> the first token's stream entry),
makespan, jobs per pool; for the placed arm, the jobs placed where they finished more than
20% later than the other pool would have finished them, from this run's records
(`misplaced`, see `misplaced`), and, as before, against the other pool's estimate at
placement (`misplaced_vs_estimate`: a real time against an estimate, which a loaded
machine's slower steps push up on either pool).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from tokenq.cli.bench.fair import quantile, summarise
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.schemas import TERMINAL_STATES, WorkerHeartbeat
from tokenq.shared.settings import Settings

MODEL = "place-fake"
Say = Callable[[str], None]


@dataclass
class PlacementConfig:
    fast_slots: int = 16
    fast_rate: float = 100.0  # tokens/s per job
    slow_slots: int = 4
    slow_rate: float = 10.0
    burst: int = 48  # 3x the fast pool's slots
    max_tokens: int = 32
    warmup: int = 8  # pinned jobs per pool first
    runs: int = 3


async def burst(url: str, n: int, max_tokens: int, pin: str | None) -> list[int | str]:
    """`n` jobs at once; each job's id, or the status of its refusal."""
    body: dict[str, Any] = {"model": MODEL, "prompt": "go", "max_tokens": max_tokens}
    if pin:
        body["backend"] = pin
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        resps = await asyncio.gather(*(http.post("/v1/jobs", json=body) for _ in range(n)))
    return [r.json()["id"] if r.status_code == 202 else r.status_code for r in resps]


def wait_done(r: redis.Redis, ids: list[str], timeout: float = 600) -> list[dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        pipe = r.pipeline(transaction=False)
        for j in ids:
            pipe.hgetall(keys.job(j))
        got: list[dict[str, str]] = pipe.execute()
        if all(h.get("state") in TERMINAL_STATES for h in got):
            return got
        if time.monotonic() > deadline:
            raise TimeoutError("jobs not done")
        time.sleep(0.2)


def first_token_at(r: redis.Redis, job_id: str) -> float | None:
    entries: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
        keys.job_events(job_id), count=8)
    for entry_id, fields in entries:
        if fields.get("e") == "token":
            return int(entry_id.split("-")[0]) / 1000
    return None


def pool_of(rec: dict[str, str]) -> str:
    return rec.get("pool", "").rpartition("@")[2]


def run_times(recs: list[dict[str, str]]) -> dict[str, float]:
    """Each pool's median job run time (started -> finished) in `recs`."""
    runs: dict[str, list[float]] = {}
    for h in recs:
        if h.get("started_at") and h.get("finished_at"):
            runs.setdefault(pool_of(h), []).append(
                float(h["finished_at"]) - float(h["started_at"]))
    return {p: statistics.median(xs) for p, xs in runs.items()}


def misplaced(recs: list[dict[str, str]], slots: dict[str, int],
              run_s: dict[str, float]) -> int:
    """The jobs that finished more than 20% later (from their creation) than another pool
    would have finished them, that pool's finish taken from the same run's records: the
    job queued behind the jobs placed there before it (created earlier), so it starts
    when the slot of the one `slots` places ahead of it ends (at once while fewer were
    ahead than its slots), and runs that pool's median run time in this arm (`run_s`: the
    warm-up's when the arm put nothing there)."""
    by_pool: dict[str, list[dict[str, str]]] = {}
    for h in recs:
        by_pool.setdefault(pool_of(h), []).append(h)
    ends = {p: sorted(float(h["finished_at"]) for h in hs) for p, hs in by_pool.items()}
    count = 0
    for h in recs:
        created = float(h["created_at"])
        took = float(h["finished_at"]) - created
        for pool, n in slots.items():
            if pool == pool_of(h) or pool not in run_s:
                continue
            ahead = sum(float(o["created_at"]) < created for o in by_pool.get(pool, []))
            start = created if ahead < n else max(created, ends[pool][ahead - n])
            if took > 1.2 * (start + run_s[pool] - created):
                count += 1
                break
    return count


def arm(st: Stack, r: redis.Redis, cfg: PlacementConfig, pin: str | None,
        warm_run_s: dict[str, float]) -> dict[str, Any]:
    t0 = time.time()
    got = asyncio.run(burst(st.url, cfg.burst, cfg.max_tokens, pin))
    ids = [g for g in got if isinstance(g, str)]
    recs = wait_done(r, ids)
    ttft = [t - float(h["created_at"]) for h, j in zip(recs, ids, strict=True)
            if (t := first_token_at(r, j)) is not None]
    on: dict[str, int] = {}
    vs_estimate = 0
    for h in recs:
        pool = pool_of(h)
        on[pool] = on.get(pool, 0) + 1
        est = json.loads(h["placement"]) if h.get("placement") else {}
        others = [f for p, (_, f) in est.items() if p != pool]
        took = float(h.get("finished_at") or 0) - float(h["created_at"])
        vs_estimate += bool(others) and took > 1.2 * min(others)
    slots = {"fast": cfg.fast_slots, "slow": cfg.slow_slots}
    wrong = None if pin is not None else misplaced(
        [h for h in recs if h.get("finished_at")], slots, {**warm_run_s, **run_times(recs)})
    return {"rejections": len(got) - len(ids),
            "succeeded": sum(h.get("state") == "succeeded" for h in recs),
            "ttft_p50_s": quantile(ttft, 0.5), "ttft_p95_s": quantile(ttft, 0.95),
            "makespan_s": max(float(h.get("finished_at") or 0) for h in recs) - t0,
            "per_pool": on, "misplaced": wrong,
            "misplaced_vs_estimate": vs_estimate if pin is None else None}


def wait_paced(r: redis.Redis, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        beats = [WorkerHeartbeat.model_validate_json(v) for v in r.hvals(keys.WORKERS)]
        if len(beats) >= 2 and all(b.pace for b in beats):
            return
        time.sleep(0.2)
    raise TimeoutError("the pools' pace was not measured")


def run_once(cfg: PlacementConfig, i: int, say: Say) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tokenq-place-") as tmp:
        state = Path(tmp)
        (state / "models.json").write_text(json.dumps({MODEL: {
            "backend": "fake", "n_ctx": 65536, "pools": {
                "fast": {"n_parallel": cfg.fast_slots, "fake_tokens_per_s": cfg.fast_rate},
                "slow": {"n_parallel": cfg.slow_slots, "fake_tokens_per_s": cfg.slow_rate}}}}))
        settings = Settings(redis_url=None, state_dir=state, models_file=state / "models.json")
        env = {"TOKENQ_API__QUEUE_LIMIT": "100000", "TOKENQ_WORKER__HEARTBEAT_S": "0.5"}
        st = Stack(settings, workers=1, models=[MODEL], quiet=True,
                   drain_timeout_s=10, env=env)
        try:
            st.start_parts()
            st.wait_ready(timeout=180, models=[MODEL])
            r = redis.Redis.from_url(st.redis_url, decode_responses=True)
            warm_run_s: dict[str, float] = {}
            for pool in ("fast", "slow"):
                warm = asyncio.run(burst(st.url, cfg.warmup, cfg.max_tokens, pool))
                warm_run_s.update(run_times(wait_done(r, [w for w in warm
                                                          if isinstance(w, str)])))
            wait_paced(r)
            out: dict[str, Any] = {}
            for name in (("placed", "fast_alone") if i % 2 == 0 else ("fast_alone", "placed")):
                out[name] = arm(st, r, cfg, None if name == "placed" else "fast", warm_run_s)
            r.close()
        finally:
            st.stop()
    p, f = out["placed"], out["fast_alone"]
    say(f"  run {i + 1}: placed {p['per_pool']}, TTFT p95 {p['ttft_p95_s']:.2f} s "
        f"(fast alone {f['ttft_p95_s']:.2f} s), makespan {p['makespan_s']:.2f} s (fast alone "
        f"{f['makespan_s']:.2f} s), rejections {p['rejections']}, misplaced {p['misplaced']} "
        f"({p['misplaced_vs_estimate']} against the estimates)")
    return out


def run_placement(cfg: PlacementConfig, say: Say = print) -> dict[str, Any]:
    say(f"tokenq bench placement: {asdict(cfg)}; fake engine, embedded Redis")
    runs = [run_once(cfg, i, say) for i in range(cfg.runs)]
    ratio = [x["placed"]["ttft_p95_s"] / max(1e-9, x["fast_alone"]["ttft_p95_s"]) for x in runs]
    span = [x["placed"]["makespan_s"] / max(1e-9, x["fast_alone"]["makespan_s"]) for x in runs]
    summary = {**summarise("ttft_p95_ratio", ratio), **summarise("makespan_ratio", span),
               "rejections": sum(x["placed"]["rejections"] for x in runs),
               "misplaced": sum(x["placed"]["misplaced"] for x in runs),
               "misplaced_vs_estimate": sum(x["placed"]["misplaced_vs_estimate"] for x in runs)}
    say(f"placed / fast alone: TTFT p95 median {summary['ttft_p95_ratio_median']:.2f}x "
        f"({min(ratio):.2f}-{max(ratio):.2f}), makespan {summary['makespan_ratio_median']:.2f}x "
        f"({min(span):.2f}-{max(span):.2f}); rejections {summary['rejections']}, misplaced "
        f"{summary['misplaced']} of {cfg.runs * cfg.burst} (against the estimates "
        f"{summary['misplaced_vs_estimate']})")
    return {"config": asdict(cfg), "runs": runs, "summary": summary}
