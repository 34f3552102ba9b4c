"""Moving queued jobs between a model's pools (workers/rebalance.py, shared/lua/move.lua),
on the fake engine: jobs placed on a slow pool while it was the only one served move to a
fast pool's worker once it is up and idle; each runs once, where its record says; a
pinned job stays; the pools' loads and queues end empty."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import BASE_ENV, redis_of, wait_terminal
from tests.integration.test_placement import beats, until
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.settings import Settings
from tokenq.workers.engines.fake import expected_output

DUO = "duo"
# 40 tokens: 2 s on `slow` (one slot), 0.4 s on `fast` (two)
POOLS = {"slow": {"n_parallel": 1, "fake_tokens_per_s": 20.0},
         "fast": {"n_parallel": 2, "fake_tokens_per_s": 100.0}}
TOKENS = 40


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    (tmp_path / "models.json").write_text(json.dumps(
        {DUO: {"backend": "fake", "n_ctx": 65536, "pools": POOLS}}))
    settings = Settings(redis_url=None, state_dir=tmp_path,
                        models_file=tmp_path / "models.json")
    st = Stack(settings, models=[DUO], quiet=True, drain_timeout_s=10,
               env=BASE_ENV)
    st.start_parts(worker_models=[])
    try:
        st.add_worker(f"{DUO}@slow")
        st.wait_ready(models=[], timeout=120)
        until("the slow pool's worker", lambda: {hb.pool for hb in beats(st).values()}
              == {f"{DUO}@slow"}, 60)
        yield st
    finally:
        st.stop()


def test_jobs_waiting_on_a_slow_pool_move_to_an_idle_fast_one(stack: Stack) -> None:
    r = redis_of(stack)
    body = {"model": DUO, "prompt": "go", "max_tokens": TOKENS, "temperature": 0}
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        pinned = c.post("/v1/jobs", json={**body, "backend": "slow"}).json()["id"]
        ids = [c.post("/v1/jobs", json=body).json()["id"] for _ in range(8)]
        assert {r.hget(keys.job(i), "pool") for i in ids} == {f"{DUO}@slow"}  # the only one
        stack.add_worker(f"{DUO}@fast")
        wait_terminal(r, [pinned, *ids], 120)
        recs = [c.get(f"/v1/jobs/{i}").json() for i in [pinned, *ids]]
    pool_of = {w: hb.pool for w, hb in beats(stack).items()}
    for rec in recs:
        assert rec["status"] == "succeeded" and rec["output"] == expected_output(TOKENS), rec
        assert rec["attempts"] == 1, rec  # ran once, where it was taken
        assert pool_of[rec["worker"]] == rec["pool"], (rec["worker"], rec["pool"])
        if rec["moved_from"] is not None:
            assert (rec["moved_from"], rec["pool"]) == (f"{DUO}@slow", f"{DUO}@fast"), rec
    assert recs[0]["pool"] == f"{DUO}@slow" and recs[0]["moved_from"] is None  # pinned
    moved = [rec for rec in recs if rec["moved_from"]]
    print(f"moved {len(moved)} of {len(ids)}: {[rec['pool'] for rec in recs]}")
    assert len(moved) >= 2, [rec["pool"] for rec in recs]
    # nothing left counted or queued: every move carried its load and its ticket
    assert set(r.hgetall(keys.POOL_LOAD).values()) <= {"0"}, r.hgetall(keys.POOL_LOAD)
    for pool in POOLS:
        for prio in keys.PRIORITIES:
            assert r.llen(keys.queue(f"{DUO}@{pool}", prio)) == 0, (pool, prio)
