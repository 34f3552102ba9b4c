"""Placement's estimates and choice (api/placement.py) and a model's pools (ModelConfig)."""

from __future__ import annotations

import pytest
import redis
from pydantic import ValidationError

from tokenq.api.errors import BudgetUnreachable, InvalidRequest
from tokenq.api.placement import PoolLoad, check_pin, choose, estimate, pins
from tokenq.shared import keys
from tokenq.shared.estimates import own_times
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.model_config import ModelConfig, pool_id, split_pool
from tokenq.shared.schemas import Pace

GPU = Pace(jobs=10, job_s=1.0, first_token_s=0.05, decode_tps=100.0, prompt_tps=10_000.0)
CPU = Pace(jobs=10, job_s=10.0, first_token_s=0.5, decode_tps=10.0, prompt_tps=1_000.0)


def load(name: str, slots: int, busy: int, pace: Pace | None, workers: int = 1) -> PoolLoad:
    return PoolLoad(name, "vllm" if name == "gpu" else "llama", workers, slots, busy, pace)


def test_a_free_slot_means_no_wait_and_a_full_pool_waits_its_turn() -> None:
    free = estimate(load("gpu", 16, 15, GPU), GPU, 1000, 101)
    assert free.first_s == pytest.approx(0.1) and free.finish_s == pytest.approx(1.1)
    # 16 running + 15 waiting: the 16th to wait starts as the running round ends (half
    # done, on average), the 17th a whole round later
    last_of_round = estimate(load("gpu", 16, 31, GPU), GPU, 1000, 101)
    assert last_of_round.first_s == pytest.approx(0.5 + 0.1)
    full = estimate(load("gpu", 16, 32, GPU), GPU, 1000, 101)
    assert full.first_s == pytest.approx(1.5 + 0.1)


def test_the_earliest_finish_wins_and_the_pin_and_the_budget_narrow_it() -> None:
    idle = [load("gpu", 16, 0, GPU), load("cpu", 4, 0, CPU)]
    assert choose(idle, 100, 100, None, None)[0] == "gpu"
    # the GPU pool 12 rounds deep (11.5 s of wait): the idle CPU pool's 10 s finish sooner
    deep = [load("gpu", 16, 192, GPU), load("cpu", 4, 0, CPU)]
    name, ests = choose(deep, 100, 100, None, None)
    assert name == "cpu" and {e.pool for e in ests} == {"gpu", "cpu"}
    assert choose(deep, 100, 100, "gpu", None)[0] == "gpu"  # pinned: waits its turn
    assert choose(idle, 100, 100, None, 200)[0] == "gpu"
    with pytest.raises(BudgetUnreachable) as err:
        choose(deep, 100, 100, "gpu", 1000)  # first token in ~11.5 s, budget 1 s
    assert err.value.retry_after == 11 and err.value.code == "budget_unreachable"


def test_an_unmeasured_pool_is_taken_at_the_others_pace_and_a_dead_one_is_skipped() -> None:
    _, ests = choose([load("gpu", 16, 0, GPU), load("cpu", 4, 0, None)], 100, 100, None, None)
    assert ests[1].finish_s == pytest.approx(ests[0].finish_s)
    nobody = [load("gpu", 16, 0, GPU, workers=0), load("cpu", 4, 0, CPU)]
    assert choose(nobody, 100, 100, None, None)[0] == "cpu"
    # no worker anywhere: it waits on its pin, else on the first pool
    none = [load("gpu", 0, 0, None, workers=0), load("cpu", 0, 0, None, workers=0)]
    assert choose(none, 1, 1, None, None)[0] == "gpu"
    assert choose(none, 1, 1, "cpu", None)[0] == "cpu"
    with pytest.raises(BudgetUnreachable):
        choose(none, 1, 1, None, 60_000)


def test_a_backend_list_is_a_pool_per_backend_and_pins_name_either() -> None:
    cfg = ModelConfig.model_validate({"backend": ["vllm", "llama"], "path": "m.gguf",
                                      "hf_path": "hf/m", "pools": {"llama": {"n_parallel": 4}}})
    assert cfg.backend == "vllm" and list(cfg.pools) == ["vllm", "llama"]
    assert cfg.pool("llama").n_parallel == 4 and cfg.pool("llama").backend == "llama"
    assert pins(cfg) == {"vllm": "vllm", "llama": "llama"}
    named = ModelConfig.model_validate({"backend": "fake", "pools": {
        "a": {}, "b": {"backend": "llama", "path": "m.gguf"}}})
    assert pins(named) == {"a": "a", "b": "b", "fake": "a", "llama": "b"}
    two = ModelConfig.model_validate({"backend": "fake", "pools": {"a": {}, "b": {}}})
    assert pins(two) == {"a": "a", "b": "b"}  # `fake` names two pools: not a pin
    with pytest.raises(InvalidRequest, match="served by a, b"):
        check_pin("m", two, "fake")
    assert check_pin("m", ModelConfig(backend="fake"), "fake") == ""
    with pytest.raises(InvalidRequest):
        check_pin("m", ModelConfig(backend="fake"), "vllm")
    assert split_pool("m@gpu") == ("m", "gpu") and split_pool("m") == ("m", None)
    assert pool_id("m", "gpu") == "m@gpu" and pool_id("m", None) == "m"


@pytest.mark.parametrize("bad", [
    {"backend": ["fake", "fake"]}, {"backend": []}, {"backend": ["auto"]},
    {"backend": "fake", "pools": {"GPU": {}}}, {"backend": "fake", "pools": {"a@b": {}}},
    {"backend": "fake", "pools": {"a": {"n_paralel": 4}}},
    {"backend": "fake", "pools": {"a": {"pools": {}}}},
    {"backend": "fake", "pools": {"a": {"backend": "llama"}}},  # llama needs a path
])
def test_a_bad_pool_entry_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ModelConfig.model_validate(bad)


def test_place_lua_estimates_what_estimate_does(r: redis.Redis) -> None:
    """place.lua (the choice, in Redis) and `estimate` (its formula in Python) agree."""
    place = Scripts(r, ("place",))["place"]
    first, decode = own_times(GPU, 1000, 101)
    for busy in (0, 15, 16, 17, 31, 32, 33, 200):
        r.hset(keys.POOL_LOAD, "m@gpu", busy)
        got = place(keys=[keys.POOL_LOAD], args=[0, "m@gpu", 16, GPU.job_s, first, decode, 1])
        est = estimate(load("gpu", 16, busy, GPU), GPU, 1000, 101)
        assert got[0] == 1 and int(r.hget(keys.POOL_LOAD, "m@gpu") or 0) == busy + 1
        assert (got[1], got[2]) == (round(est.first_s * 1000), round(est.finish_s * 1000)), busy
