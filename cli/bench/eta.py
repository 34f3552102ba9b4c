"""`tokenq bench eta`: how good the eta a job is given at enqueue is (docs/scheduling.md,
"Position and ETA").

One stack on the fake engine (embedded Redis, `workers` workers of `slots` slots, fair
share on), per run: a warm-up (`warmup` jobs, so the pool's pace is measured), then a
backlog of `jobs` jobs submitted at once by `tenants` tenants round-robin. For each backlog
job: the eta_s of its 202 (at enqueue) against its real wait (started_at - created_at);
the relative error is |eta - wait| / max(wait, 1 s) (a job that starts at once is not
judged on fractions of a second). Figures per run: the p90 relative error and the share
of jobs within 25%; `runs` runs on fresh stacks, then their median and spread.
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
from tokenq.shared.settings import Settings

MODEL = "eta-fake"
Say = Callable[[str], None]


@dataclass
class EtaConfig:
    jobs: int = 200
    warmup: int = 80
    tenants: int = 4
    workers: int = 2
    slots: int = 2  # per worker
    token_rate: float = 64.0  # the fake engine's tokens/s per job
    max_tokens: int = 32
    runs: int = 3


async def submit_all(url: str, keys_of: list[str], n: int, max_tokens: int
                     ) -> list[dict[str, Any]]:
    """`n` jobs, tenants round-robin, in order (one request at a time: enqueue order is the
    submission order); their 202 bodies."""
    out = []
    body = {"model": MODEL, "prompt": "go", "max_tokens": max_tokens}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for i in range(n):
            key = keys_of[i % len(keys_of)]
            resp = await http.post("/v1/jobs", json=body,
                                   headers={"Authorization": f"Bearer {key}"})
            resp.raise_for_status()
            out.append(resp.json())
    return out


def wait_started(r: redis.Redis, ids: list[str], timeout: float) -> list[tuple[float, float]]:
    """(created_at, started_at) of each job, once all have started."""
    deadline = time.monotonic() + timeout
    while True:
        pipe = r.pipeline(transaction=False)
        for j in ids:
            pipe.hmget(keys.job(j), ["created_at", "started_at"])
        got = pipe.execute()
        if all(h[1] for h in got):
            return [(float(h[0]), float(h[1])) for h in got]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sum(not h[1] for h in got)} jobs never started")
        time.sleep(0.2)


def run_once(cfg: EtaConfig, i: int, say: Say) -> dict[str, Any]:
    names = [f"t{k}" for k in range(cfg.tenants)]
    keys_of = [f"bench-eta-{t}" for t in names]
    with tempfile.TemporaryDirectory(prefix="tokenq-eta-") as tmp:
        state = Path(tmp)
        (state / "models.json").write_text(json.dumps({MODEL: {
            "backend": "fake", "n_ctx": 4096, "n_parallel": cfg.slots,
            "fake_tokens_per_s": cfg.token_rate}}))
        env = {"TOKENQ_API_KEYS": ",".join(f"{k}:{t}" for t, k in zip(names, keys_of,
                                                                       strict=True)),
               "TOKENQ_API__QUEUE_LIMIT": "1000000", "TOKENQ_API__TENANT_MAX_QUEUED": "0"}
        settings = Settings(redis_url=None, state_dir=state, models_file=state / "models.json")
        st = Stack(settings, workers=cfg.workers, models=[MODEL], quiet=True,
                   drain_timeout_s=10, env=env)
        try:
            st.start_parts()
            st.wait_ready(timeout=180, models=[MODEL])
            r = redis.Redis.from_url(st.redis_url, decode_responses=True)
            warm = asyncio.run(submit_all(st.url, keys_of, cfg.warmup, cfg.max_tokens))
            wait_started(r, [a["id"] for a in warm], timeout=600)
            time.sleep(2 * cfg.max_tokens / cfg.token_rate)  # the pool idle again
            accepted = asyncio.run(submit_all(st.url, keys_of, cfg.jobs, cfg.max_tokens))
            times = wait_started(r, [a["id"] for a in accepted], timeout=600)
            r.close()
        finally:
            st.stop()
    errors, unknown = [], 0
    for a, (created, started) in zip(accepted, times, strict=True):
        if a.get("eta_s") is None:
            unknown += 1
            errors.append(float("inf"))
            continue
        wait = started - created
        errors.append(abs(a["eta_s"] - wait) / max(wait, 1.0))
    out = {"p90_rel_error": quantile(errors, 0.9),
           "median_rel_error": quantile(errors, 0.5),
           "within_25pct": sum(e <= 0.25 for e in errors) / len(errors),
           "unknown_eta": unknown,
           "last_wait_s": times[-1][1] - times[-1][0],
           "last_eta_s": accepted[-1].get("eta_s")}
    say(f"  run {i + 1}: p90 relative error {out['p90_rel_error']:.3f}, within 25% "
        f"{out['within_25pct']:.1%} of {len(errors)} jobs (last job: eta "
        f"{out['last_eta_s']} s, waited {out['last_wait_s']:.2f} s)")
    return out


def run_eta(cfg: EtaConfig, say: Say = print) -> dict[str, Any]:
    say(f"tokenq bench eta: {asdict(cfg)}; fake engine, embedded Redis, fair share")
    runs = [run_once(cfg, i, say) for i in range(cfg.runs)]
    p90 = [x["p90_rel_error"] for x in runs]
    within = [x["within_25pct"] for x in runs]
    summary = {**summarise("p90_rel_error", p90), **summarise("within_25pct", within),
               "goal_met": statistics.median(p90) <= 0.25}
    say(f"p90 relative error: median {summary['p90_rel_error_median']:.3f} "
        f"(range {min(p90):.3f}-{max(p90):.3f}); within 25%: median "
        f"{summary['within_25pct_median']:.1%} (range {min(within):.1%}-{max(within):.1%})")
    return {"config": asdict(cfg), "runs": runs, "summary": summary}
