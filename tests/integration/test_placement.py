"""Placement (issue 42 part 2, api/placement.py): a model served by two pools at once, each
with its own workers; jobs go where they are estimated to finish first, pinned jobs where
pinned, and a first-token budget nobody can meet is refused at once. On the fake engine at
two pools' speeds (the real engines' run: docs/scheduling.md)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.faults.harness import BASE_ENV, redis_of, wait_terminal
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.schemas import WorkerHeartbeat
from tokenq.shared.settings import Settings
from tokenq.workers.engines.fake import expected_output

DUO = "duo"
# A fast pool and a slow one: 20 tokens take 0.2 s on `fast`, 1 s on `slow`.
POOLS = {"fast": {"n_parallel": 2, "fake_tokens_per_s": 100.0},
         "slow": {"n_parallel": 2, "fake_tokens_per_s": 20.0}}
TOKENS = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("placement")
    models = {DUO: {"backend": "fake", "n_ctx": 65536, "pools": POOLS}}
    (tmp / "models.json").write_text(json.dumps(models))
    settings = Settings(redis_url=None, state_dir=tmp, models_file=tmp / "models.json")
    st = Stack(settings, workers=1, models=[DUO], quiet=True,
               drain_timeout_s=10, env=BASE_ENV)
    st.start_parts()
    try:
        st.wait_ready(models=[DUO], timeout=120)
        wait_pools(st, {f"{DUO}@{p}" for p in POOLS})
        yield st
    finally:
        st.stop()


def beats(stack: Stack) -> dict[str, WorkerHeartbeat]:
    raw = redis_of(stack).hgetall(keys.WORKERS)
    return {w: WorkerHeartbeat.model_validate_json(v) for w, v in raw.items()}


def until(what: str, ok: Callable[[], object], timeout: float) -> None:
    """Poll `ok` until it holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


def wait_pools(stack: Stack, pools: set[str], timeout: float = 60) -> None:
    until(f"workers of {pools}", lambda: {hb.pool for hb in beats(stack).values()} >= pools,
          timeout)


def post(client: httpx.Client, **extra: Any) -> httpx.Response:
    return client.post("/v1/jobs", json={"model": DUO, "prompt": "go", "max_tokens": TOKENS,
                                         "temperature": 0, **extra})


def records(stack: Stack, ids: list[str]) -> list[dict[str, Any]]:
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        return [c.get(f"/v1/jobs/{i}").json() for i in ids]


def test_a_pinned_job_runs_on_its_pool(stack: Stack) -> None:
    pool_of = {w: hb.pool for w, hb in beats(stack).items()}
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        ids = [post(c, backend=p).json()["id"] for p in ("slow", "fast", "slow")]
    wait_terminal(redis_of(stack), ids, 60)
    recs = records(stack, ids)
    assert [r["pool"] for r in recs] == [f"{DUO}@slow", f"{DUO}@fast", f"{DUO}@slow"]
    for r in recs:
        assert r["status"] == "succeeded", r
        assert r["output"] == expected_output(TOKENS)
        assert pool_of[r["worker"]] == r["pool"], (r["worker"], pool_of)
        assert set(r["placement"]) == set(POOLS)  # both estimated, the pin chose


def test_a_burst_spills_onto_the_slow_pool_once_the_fast_one_is_estimated_later(
        stack: Stack) -> None:
    # both pools measured first (the workers' pace, in their heartbeats)
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        warm = [post(c, backend=p).json()["id"] for p in ("fast", "slow") for _ in range(2)]
        wait_terminal(redis_of(stack), warm, 60)
        until("both pools' pace", lambda: all(hb.pace for hb in beats(stack).values()), 10)
        ids = [post(c).json()["id"] for _ in range(24)]
    wait_terminal(redis_of(stack), ids, 120)
    recs = records(stack, ids)
    # where each was placed (a job may later move to an idle pool: test_rebalance.py)
    on = [r["moved_from"] or r["pool"] for r in recs]
    # the fast pool first (it finishes 20 tokens 5x sooner), the slow one once the fast
    # one's queue makes it later
    assert on[0] == f"{DUO}@fast", on
    assert on.count(f"{DUO}@slow") >= 1 and on.count(f"{DUO}@fast") > on.count(f"{DUO}@slow"), on
    # every job ended: none is counted in a pool's load any more (terminal.lua)
    load = redis_of(stack).hgetall(keys.POOL_LOAD)
    assert set(load) == {f"{DUO}@{p}" for p in POOLS} and set(load.values()) == {"0"}, load
    for r, placed in zip(recs, on, strict=True):
        assert r["status"] == "succeeded" and r["output"] == expected_output(TOKENS), r
        _, finish = r["placement"][placed.split("@")[1]]
        assert finish == min(f for _, f in r["placement"].values()), r["placement"]


def test_bad_placement_input_is_a_400_and_an_unreachable_budget_a_503(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as c:
        for extra, param in (({"backend": "tpu"}, "backend"), ({"ttft_budget_ms": 0}, None),
                             ({"ttft_budget_ms": 10**9}, None), ({"backend": ""}, None)):
            resp = post(c, **extra)
            assert resp.status_code == 400, (extra, resp.text)
            err = resp.json()["error"]
            assert err["type"] == "invalid_request_error", err
            if param:
                assert err["param"] == param and "fast" in err["message"], err
        resp = post(c, ttft_budget_ms=1)  # below any pool's first token
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "budget_unreachable"
        assert int(resp.headers["Retry-After"]) >= 1
        resp = c.post("/v1/chat/completions", json={
            "model": DUO, "messages": [{"role": "user", "content": "go"}], "max_tokens": 3,
            "backend": "slow", "ttft_budget_ms": 60_000})
        assert resp.status_code == 200, resp.text


def test_the_autoscaler_scales_each_pool_by_its_own_lanes(tmp_path: Path) -> None:
    """`tokenq autoscale --model duo` scales `duo@fast` and `duo@slow` apart: a burst pinned
    to the slow pool brings up slow workers only, and they go back to none after."""
    from tokenq.cli.autoscale import Autoscaler
    from tokenq.cli.scaling import Policy

    (tmp_path / "models.json").write_text(json.dumps(
        {DUO: {"backend": "fake", "n_ctx": 65536, "pools": POOLS}}))
    settings = Settings(redis_url=None, state_dir=tmp_path, models_file=tmp_path / "models.json")
    st = Stack(settings, models=[DUO], quiet=True, drain_timeout_s=10,
               env=BASE_ENV)
    st.start_parts(worker_models=[])
    r = redis_of(st)
    scaler = Autoscaler(r, settings, [DUO], Policy(min_workers=0, max_workers=2,
                                                    down_window_s=2, cooldown_s=2),
                        spawn=st.spawn_worker, follow_catalogue=False)
    st.autoscaler = scaler
    stop = threading.Event()
    loop = threading.Thread(target=scaler.run, args=(stop, 0.25), daemon=True)
    try:
        st.wait_ready(timeout=60)
        loop.start()
        assert scaler.models == [f"{DUO}@fast", f"{DUO}@slow"]
        with httpx.Client(base_url=st.url, timeout=10) as c:
            ids = [post(c, backend="slow").json()["id"] for _ in range(8)]
        wait_terminal(r, ids, 120)
        assert [x["status"] for x in records(st, ids)] == ["succeeded"] * 8
        assert scaler.peak[f"{DUO}@slow"] == 2 and scaler.peak[f"{DUO}@fast"] == 0, scaler.peak
        until("the slow pool back to 0",
              lambda: not scaler.procs[f"{DUO}@slow"] and not scaler.draining, 60)
    finally:
        stop.set()
        loop.join(10)
        st.stop()
        r.close()
