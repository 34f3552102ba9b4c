"""The vLLM worker's scheduler (workers/engines/vllm_sched.py) on vLLM's own Scheduler.

A real vLLM scheduler over a KV cache of 1,000 blocks, no model: each schedule() is one
step's plan, and a request's computed tokens advance as the step is planned. Prompts here
are long enough to be split over steps at a 256-token budget, as a batch's are on a CPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.conftest import MAX_MODEL_LEN
from tokenq.workers.engines.vllm_args import BATCH_ALONE_KEY, BATCH_PREFILL_KEY, HIGH, LOW, NORMAL

# vLLM's and torch's imports warn of their own deprecations, not ours.
pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

BUDGET = 256
BATCH_PREFILL = 32


def scheduler(model: Path, slots: int = 8, tiered: bool = True, alone: int = 0) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from tokenq.workers.engines.vllm_sched import TieredScheduler

    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    cache.num_gpu_blocks = 1000
    config = VllmConfig(
        model_config=ModelConfig(model=str(model), max_model_len=MAX_MODEL_LEN,
                                 dtype="float32"),
        scheduler_config=SchedulerConfig(
            max_num_seqs=slots, max_num_batched_tokens=BUDGET, max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False, enable_chunked_prefill=True, policy="priority"),
        cache_config=cache,
        additional_config={BATCH_PREFILL_KEY: BATCH_PREFILL, BATCH_ALONE_KEY: alone})
    kv = KVCacheConfig(num_blocks=1000, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1,
                                                       head_size=16, dtype=torch.float32))])
    cls = TieredScheduler if tiered else Scheduler
    return cls(vllm_config=config, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(config), block_size=16)


def add(s: Any, rid: str, prompt: int, priority: int) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    s.add_request(Request(request_id=rid, prompt_token_ids=list(range(1, prompt + 1)),
                          sampling_params=SamplingParams(max_tokens=8), pooling_params=None,
                          priority=priority, arrival_time=time.time()))


def step(s: Any) -> dict[str, int]:
    """One step planned and run: a request whose prompt is done samples token 7."""
    from vllm.v1.outputs import ModelRunnerOutput

    out = s.schedule()
    planned = dict(out.num_scheduled_tokens)
    ids = list(planned)
    done = {r.request_id for r in s.running if r.num_computed_tokens >= r.num_tokens}
    s.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
        sampled_token_ids=[[7] if rid in done else [] for rid in ids]))
    return planned


def test_an_interactive_prompt_goes_ahead_of_a_batch_prompt_under_way(
        tiny_model: Path) -> None:
    s = scheduler(tiny_model)
    for k in range(3):
        add(s, f"low{k}", 900, LOW)
    assert step(s) == {"low0": BUDGET}  # the batch alone: vLLM's own step
    add(s, "high", 100, HIGH)
    # The high job's prompt whole, and no batch prompt tokens beside it.
    assert step(s) == {"high": 100}
    # vLLM's own scheduler fills the step with the batch prompt under way first.
    plain = scheduler(tiny_model, tiered=False)
    for k in range(3):
        add(plain, f"low{k}", 900, LOW)
    step(plain)
    add(plain, "high", 100, HIGH)
    assert step(plain) == {"low0": BUDGET}


def test_beside_a_watched_stream_a_step_holds_few_batch_prompt_tokens(
        tiny_model: Path) -> None:
    s = scheduler(tiny_model)
    add(s, "normal", 50, NORMAL)
    assert step(s) == {"normal": 50}  # now it decodes
    for k in range(3):
        add(s, f"low{k}", 900, LOW)
    for _ in range(3):  # its decode and one batch prompt a step, BATCH_PREFILL of it
        assert step(s) == {"normal": 1, "low0": BATCH_PREFILL}
    s.finish_requests("normal", finished_status=_finished())
    assert step(s) == {"low0": BUDGET}  # the batch alone again: vLLM's own step


def test_the_batch_alone_takes_a_bounded_step(tiny_model: Path) -> None:
    s = scheduler(tiny_model, alone=128)
    for k in range(3):
        add(s, f"low{k}", 200, LOW)
    assert step(s) == {"low0": 128}
    assert step(s) == {"low0": 72, "low1": 56}  # what low0 leaves of 128 starts low1
    assert step(s) == {"low0": 1, "low1": 128}  # low0 decodes


def test_held_requests_keep_their_place_and_slots(tiny_model: Path) -> None:
    s = scheduler(tiny_model, slots=4)
    for k in range(3):
        add(s, f"low{k}", 300, LOW)
    for _ in range(3):
        step(s)
    assert [r.request_id for r in s.running] == ["low0", "low1", "low2"]
    add(s, "high", 40, HIGH)
    add(s, "normal", 40, NORMAL)
    # The batch's decodes run (low0 and low1 are done with their prompts); low2's prompt
    # sits the step out.
    assert step(s) == {"low0": 1, "low1": 1, "high": 40}
    # The held batch prompt is still running, in its place, and holds its slot: the
    # normal job waits for a free one (the engine holds no more requests than its slots).
    assert [r.request_id for r in s.running] == ["low0", "low1", "low2", "high"]
    assert [r.request_id for r in s.waiting] == ["normal"]


def _finished() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


def test_without_a_batch_the_step_is_vllms_own(tiny_model: Path) -> None:
    from tokenq.workers.engines.vllm_sched import plan_step

    s = scheduler(tiny_model)
    for k in range(3):
        add(s, f"normal{k}", 900, NORMAL)
    step(s)
    add(s, "high", 100, HIGH)
    assert plan_step(s.running, list(s.waiting), BUDGET, BATCH_PREFILL, 128) is None
    assert step(s) == {"normal0": BUDGET}  # vLLM's order: the prompt under way first
