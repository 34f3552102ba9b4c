"""`tokenq bench fair`: fair share between tenants (docs/scheduling.md) against FIFO.

One stack on the fake engine (embedded Redis, `apis` API processes, `workers` workers), run
three times: fair share with a heavy tenant, FIFO with the same load, and fair share with
the heavy tenant absent (the light tenants' baseline wait). Light tenants each submit jobs
at `light_rate` a second (Poisson), the heavy one at `heavy_factor` times that; requests
go round-robin to the API processes, one of which is restarted midway.

Figures, per arm: Jain's fairness index per `window_s` window over the tenants with work
in that window, each tenant's tokens served (prompt + output, counted over each job's run)
divided by its max-min fair allocation (water-filling the window's served tokens over
their demand: what was waiting at the window's start or arrived in it); 1 is exactly fair.
And the light tenants' p95 queue wait (created -> started).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import redis

from tokenq.cli.stack import Stack, python_module
from tokenq.shared import keys
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings

MODEL = "fair-fake"
Say = Callable[[str], None]


@dataclass
class FairConfig:
    tenants: int = 10
    heavy_factor: float = 100.0
    workers: int = 2
    apis: int = 3
    slots: int = 2  # per worker
    token_rate: float = 64.0  # the fake engine's tokens/s per job
    max_tokens: int = 32
    light_rate: float = 0.3  # jobs/s per light tenant
    seconds: float = 60.0  # per arm
    window_s: float = 30.0
    # The arrivals' seed: 0 keeps the arrivals every run before it had (one seed is one
    # arrival pattern; its bursts decide the p95: run several).
    seed: int = 0


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs and any(xs) else 1.0


def water_fill(demand: dict[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair allocation of `capacity` over `demand`."""
    alloc: dict[str, float] = {}
    left = dict(demand)
    while left:
        share = capacity / len(left)
        under = {t: d for t, d in left.items() if d <= share}
        if not under:
            alloc.update(dict.fromkeys(left, share))
            return alloc
        for t, d in under.items():
            alloc[t] = d
            capacity -= d
            del left[t]
    return alloc


def summarise(name: str, xs: list[float]) -> dict[str, Any]:
    """Several runs' figures: `{name}_median` and `{name}_range` ([min, max])."""
    return {f"{name}_median": statistics.median(xs), f"{name}_range": [min(xs), max(xs)]}


def quantile(xs: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 for none)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def figures(jobs: list[dict[str, Any]], t0: float, t1: float, window_s: float,
            light: set[str]) -> dict[str, Any]:
    """Jain's index per window and the light tenants' p95 queue wait (see the module)."""
    indexes = []
    start = t0
    while start + window_s <= t1 + 1e-6:
        end = start + window_s
        served: dict[str, float] = {}
        demand: dict[str, float] = {}
        for j in jobs:
            size = j["tokens"]
            s, f = j["started"] or float("inf"), j["finished"] or float("inf")
            if j["created"] < end and s > start:
                demand[j["owner"]] = demand.get(j["owner"], 0.0) + size
            if s < end and f > start and f > s:
                overlap = (min(f, end) - max(s, start)) / (f - s)
                served[j["owner"]] = served.get(j["owner"], 0.0) + size * overlap
        alloc = water_fill(demand, sum(served.values()))
        indexes.append(jain([served.get(t, 0.0) / a for t, a in alloc.items() if a > 0]))
        start = end
    waits = [j["started"] - j["created"] for j in jobs
             if j["owner"] in light and j["started"] and j["created"] >= t0]
    return {"jain": indexes, "jain_min": min(indexes) if indexes else None,
            "light_wait_p95_s": quantile(waits, 0.95), "light_jobs": len(waits),
            "light_waits_s": sorted(waits)}


async def load(urls: list[str], keys_of: dict[str, str], rates: dict[str, float],
               cfg: FairConfig, stop_at: float) -> int:
    """Open-loop Poisson arrivals per tenant, round-robin over the API processes (a refused
    or failed request goes to the next one). The number of jobs accepted."""
    accepted = 0
    turn = 0

    async def tenant(name: str, rate: float, http: httpx.AsyncClient) -> None:
        nonlocal accepted, turn
        rng = random.Random(name if cfg.seed == 0 else f"{cfg.seed}:{name}")
        nxt = time.monotonic()
        body = {"model": MODEL, "prompt": "go", "max_tokens": cfg.max_tokens}
        while (nxt := nxt + rng.expovariate(rate)) < stop_at:
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))
            for _ in range(len(urls)):
                turn += 1
                try:
                    resp = await http.post(f"{urls[turn % len(urls)]}/v1/jobs", json=body,
                                           headers={"Authorization": f"Bearer {keys_of[name]}"})
                except httpx.HTTPError:
                    continue
                if resp.status_code == 202:
                    accepted += 1
                    break

    async with httpx.AsyncClient(timeout=10) as http:
        await asyncio.gather(*(tenant(t, r, http) for t, r in rates.items() if r > 0))
    return accepted


def read_jobs(r: redis.Redis, tenants: list[str]) -> list[dict[str, Any]]:
    out = []
    for t in tenants:
        ids: list[str] = r.zrange(keys.tenant_jobs(t), 0, -1)  # type: ignore[assignment]
        pipe = r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.job(job_id), ["created_at", "started_at", "finished_at",
                                          "prompt_tokens", "n_tokens"])
        for h in pipe.execute():
            out.append({"owner": t, "created": float(h[0] or 0),
                        "started": float(h[1]) if h[1] else None,
                        "finished": float(h[2]) if h[2] else None,
                        "tokens": float(h[3] or 0) + float(h[4] or 0)})
    return out


def run_arm(cfg: FairConfig, *, fair: bool, heavy: bool, say: Say) -> dict[str, Any]:
    names = [f"t{i}" for i in range(cfg.tenants)]
    keys_of = {t: f"bench-fair-{t}" for t in names}
    rates = dict.fromkeys(names, cfg.light_rate)
    rates[names[0]] = cfg.light_rate * cfg.heavy_factor if heavy else 0.0
    with tempfile.TemporaryDirectory(prefix="tokenq-fair-") as tmp:
        state = Path(tmp)
        (state / "models.json").write_text(json.dumps({MODEL: {
            "backend": "fake", "n_ctx": 4096, "n_parallel": cfg.slots,
            "fake_tokens_per_s": cfg.token_rate}}))
        env = {"TOKENQ_API_KEYS": ",".join(f"{k}:{t}" for t, k in keys_of.items()),
               "TOKENQ_FAIR_SHARE": "true" if fair else "false",
               "TOKENQ_FAIR_SHARE_WINDOW_S": str(cfg.window_s),
               "TOKENQ_API__QUEUE_LIMIT": "1000000", "TOKENQ_API__TENANT_MAX_QUEUED": "0",
               "TOKENQ_API__DRAIN_S": "2"}
        settings = Settings(redis_url=None, state_dir=state, models_file=state / "models.json")
        st = Stack(settings, workers=cfg.workers, models=[MODEL], quiet=True,
                   drain_timeout_s=10, env=env)
        extra: list[Any] = []
        try:
            st.start_parts()
            ports = [free_port() for _ in range(cfg.apis - 1)]

            def spawn(i: int) -> Any:
                return st._spawn(f"api-{i}", python_module(
                    "tokenq.api.server", "--host", st.host, "--port", str(ports[i])))

            extra = [spawn(i) for i in range(len(ports))]
            st.wait_ready(timeout=180, models=[MODEL])
            urls = [st.url, *(f"http://{st.host}:{p}" for p in ports)]
            r = redis.Redis.from_url(st.redis_url, decode_responses=True)
            t0 = time.time()
            stop_at = time.monotonic() + cfg.seconds

            async def with_restart() -> int:
                task = asyncio.create_task(load(urls, keys_of, rates, cfg, stop_at))
                await asyncio.sleep(cfg.seconds / 2)
                if extra:  # one replica restarted midway: SIGTERM (drain), then again
                    extra[0].terminate()
                    await asyncio.to_thread(extra[0].wait, 30)
                    extra[0] = spawn(0)
                accepted = await task
                # the arrivals end at their last one before stop_at: the run lasts the whole
                # of `seconds`, so its last window is counted too
                await asyncio.sleep(stop_at - time.monotonic())
                return accepted

            accepted = asyncio.run(with_restart())
            t1 = time.time()
            jobs = read_jobs(r, names)
            out = figures(jobs, t0, t1, cfg.window_s, set(names[1:]))
            out.update(accepted=accepted, fair=fair, heavy=heavy)
            say(f"  {'fair' if fair else 'FIFO'}{'' if heavy else ', heavy absent'}: "
                f"Jain per {cfg.window_s:g} s window "
                f"{', '.join(f'{x:.3f}' for x in out['jain'])}; light p95 queue wait "
                f"{out['light_wait_p95_s'] * 1000:.0f} ms ({out['light_jobs']} jobs; "
                f"{accepted} accepted)")
            r.close()
            return out
        finally:
            for p in extra:
                p.terminate()
            st.stop()


def run_fair(cfg: FairConfig, say: Say = print, seeds: Sequence[int] = ()) -> dict[str, Any]:
    """One run of the three arms per arrival seed (`seeds`, else `cfg.seed`); with several,
    each run's figures and the figures over all of them (`pooled`)."""
    if len(seeds) <= 1:
        return run_seed(replace(cfg, seed=seeds[0]) if seeds else cfg, say)
    runs = [run_seed(replace(cfg, seed=seed), say) for seed in seeds]
    out = pooled(runs)
    say(f"{len(runs)} seeds: fair/heavy-absent light p95 wait per seed "
        f"{', '.join(f'{x:.2f}x' for x in out['fair_wait_ratios'])} (median "
        f"{out['fair_wait_ratio_median']:.2f}x); pooled over the seeds "
        f"{out['pooled_fair_p95_s'] * 1000:.1f} ms / {out['pooled_absent_p95_s'] * 1000:.1f} ms"
        f" = {out['pooled_fair_wait_ratio']:.2f}x (FIFO {out['pooled_fifo_wait_ratio']:.2f}x);"
        f" min Jain {out['fair_jain_min']:.3f}")
    return {"runs": runs, "pooled": out}


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several seeds' runs: each one's wait ratio, and the light p95 wait of each arm over
    the light jobs of every run (a p95 over more jobs: one run's rests on its ~8 longest
    waits, which a single burst of light arrivals decides)."""
    p95 = {arm: quantile([w for r in runs for w in r[arm]["light_waits_s"]], 0.95)
           for arm in ("fair", "fifo", "heavy_absent")}
    ratios = [r["summary"]["fair_wait_ratio"] for r in runs]
    base = max(p95["heavy_absent"], 1e-3)
    return {"seeds": [r["config"]["seed"] for r in runs], "fair_wait_ratios": ratios,
            "fair_wait_ratio_median": statistics.median(ratios),
            "fair_jain_min": min(r["summary"]["fair_jain_min"] for r in runs),
            "pooled_fair_p95_s": p95["fair"], "pooled_fifo_p95_s": p95["fifo"],
            "pooled_absent_p95_s": p95["heavy_absent"],
            "pooled_fair_wait_ratio": p95["fair"] / base,
            "pooled_fifo_wait_ratio": p95["fifo"] / base}


def run_seed(cfg: FairConfig, say: Say = print) -> dict[str, Any]:
    say(f"tokenq bench fair: {asdict(cfg)}; fake engine, embedded Redis, one of "
        f"{cfg.apis} API processes restarted midway")
    fair = run_arm(cfg, fair=True, heavy=True, say=say)
    fifo = run_arm(cfg, fair=False, heavy=True, say=say)
    alone = run_arm(cfg, fair=True, heavy=False, say=say)
    base = max(alone["light_wait_p95_s"], 1e-3)
    summary = {"fair_jain_min": fair["jain_min"], "fifo_jain_min": fifo["jain_min"],
               "fair_wait_ratio": fair["light_wait_p95_s"] / base,
               "fifo_wait_ratio": fifo["light_wait_p95_s"] / base}
    say(f"fair: min Jain {fair['jain_min']:.3f}, light p95 wait "
        f"{summary['fair_wait_ratio']:.2f}x the heavy-absent one; FIFO: min Jain "
        f"{fifo['jain_min']:.3f}, {summary['fifo_wait_ratio']:.2f}x")
    return {"config": asdict(cfg), "fair": fair, "fifo": fifo, "heavy_absent": alone,
            "summary": summary}
