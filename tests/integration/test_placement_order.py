"""Placement counts a job behind the jobs placed before it in its pool (api/placement.py),
so a replica's jobs must reach their pool's lane in the order they were placed, however
the event loop interleaves a burst's requests. In-process API, no worker: the pools' live
workers are heartbeats written here."""

from __future__ import annotations

import asyncio
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from tokenq.api import placement
from tokenq.api.app import create_app
from tokenq.shared import keys
from tokenq.shared.model_config import pool_id
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import Pace, WorkerHeartbeat
from tokenq.shared.settings import Settings

DUO = "duo"
POOLS = {"fast": 100.0, "slow": 20.0}  # fake tokens/s per job
PACES = {"fast": Pace(jobs=10, job_s=0.2, first_token_s=0.01, decode_tps=100.0,
                      prompt_tps=10_000.0),
         "slow": Pace(jobs=10, job_s=1.0, first_token_s=0.05, decode_tps=20.0,
                      prompt_tps=2_000.0)}


def beat(r: redis.Redis, pool: str) -> None:
    hb = WorkerHeartbeat(model=DUO, backend="fake", slots=2, running=0, waiting=0,
                         ts=time.time(), pool=pool_id(DUO, pool), pace=PACES[pool])
    r.hset(keys.WORKERS, f"w-{pool}", hb.model_dump_json())


def test_a_burst_reaches_each_lane_in_the_order_it_was_placed(
        redis_server: EmbeddedRedis, r: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    models = {DUO: {"backend": "fake", "pools": {
        n: {"n_parallel": 2, "fake_tokens_per_s": tps} for n, tps in POOLS.items()}}}
    (tmp_path / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=redis_server.url.rsplit("/", 1)[0] + "/15",
                        state_dir=tmp_path, models_file=tmp_path / "models.json",
                        served_models=[DUO])
    for pool in POOLS:
        beat(r, pool)
    # Each placement is stamped with its order, then held a random few ms before its
    # create, as a busy event loop holds it: without the order kept, later placements
    # overtake earlier ones on their way to the lane.
    real_place, seq, rng = placement.place, iter(range(10**6)), random.Random(7)

    async def slow_place(*args: Any, **kw: Any) -> str:
        pool = await real_place(*args, **kw)
        args[3]["placed_seq"] = str(next(seq))  # fields: recorded with the job
        await asyncio.sleep(rng.uniform(0, 0.01))
        return pool

    monkeypatch.setattr(placement, "place", slow_place)
    with TestClient(create_app(settings)) as c, ThreadPoolExecutor(24) as ex:
        answers = list(ex.map(lambda _: c.post("/v1/jobs", json={
            "model": DUO, "prompt": "go", "max_tokens": 20}), range(48)))
    assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
    lanes = 0
    for pool in POOLS:
        lane = keys.lane(keys.queue(pool_id(DUO, pool), "normal"))
        for list_key in r.scan_iter(f"{lane}:t:*"):
            ids = r.lrange(list_key, 0, -1)
            order = [int(r.hget(keys.job(i), "placed_seq") or -1) for i in ids]
            assert order == sorted(order), f"{pool}: lane order {order}"
            lanes += len(ids) > 1
    assert lanes == 2  # the burst spilled onto both pools


def test_the_order_is_not_kept_when_turned_off_nor_with_durable_replicas() -> None:
    """`api.placement_in_order` off: no lock. `api.durable_replicas`: no lock either (the
    create's WAIT, up to durable_timeout_ms, would hold every submit of the model)."""
    import contextlib
    from types import SimpleNamespace

    from tokenq.shared.model_config import ModelConfig
    from tokenq.shared.settings_roles import ApiSettings

    cfg = ModelConfig.model_validate({"backend": "fake", "pools": {"a": {}, "b": {}}})
    one_pool = ModelConfig.model_validate({"backend": "fake"})

    def held(cfg: ModelConfig, **api: Any) -> bool:
        state = SimpleNamespace(settings=SimpleNamespace(api=ApiSettings(**api)),
                                background={})
        ctx = placement.in_order(state, DUO, cfg)  # type: ignore[arg-type]
        return not isinstance(ctx, contextlib.nullcontext)

    assert held(cfg)
    assert not held(one_pool)
    assert not held(cfg, placement_in_order=False)
    assert not held(cfg, durable_replicas=1)
