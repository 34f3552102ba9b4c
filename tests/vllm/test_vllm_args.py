"""A model config's step budget reaches vLLM (`max_num_batched_tokens`), for tokenq's vLLM
worker and the bench's `vllm serve` peer alike; left unset, it is CPU_STEP_TOKENS on a
CPU (vLLM's own default on a GPU). The worker's engine runs tokenq's scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenq.cli.bench.compare_vllm import vllm_server_args
from tokenq.shared.settings import ModelConfig

pytestmark = pytest.mark.vllm
VLLM = {"backend": "vllm", "source": "hf", "path": "/models/m"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vLLM's imports, not ours
def test_the_step_budget_reaches_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from tokenq.workers.engines.vllm_args import (
        BATCH_ALONE_KEY,
        BATCH_PREFILL_KEY,
        CPU_BATCH_ALONE_TOKENS,
        CPU_STEP_TOKENS,
        SCHEDULER,
        engine_args,
    )

    cfg = ModelConfig(**VLLM, max_num_batched_tokens=512)
    assert engine_args(cfg, tmp_path, {}).max_num_batched_tokens == 512
    args = vllm_server_args(str(tmp_path), "m", cfg, 8000)
    assert args[args.index("--max-num-batched-tokens") + 1] == "512"
    unset = engine_args(ModelConfig(**VLLM), tmp_path, {})  # this CPU: no NVIDIA GPU
    assert unset.max_num_batched_tokens == CPU_STEP_TOKENS
    args = vllm_server_args(str(tmp_path), "m", ModelConfig(**VLLM), 8000)
    assert args[args.index("--max-num-batched-tokens") + 1] == str(CPU_STEP_TOKENS)
    # Without chunked prefill a budget under the context length would refuse long prompts.
    whole = engine_args(ModelConfig(**VLLM, enable_chunked_prefill=False), tmp_path, {})
    assert whole.max_num_batched_tokens is None
    assert unset.scheduler_cls == SCHEDULER and unset.scheduling_policy == "priority"
    assert unset.additional_config == {BATCH_PREFILL_KEY: ModelConfig(**VLLM).batch_prefill_tokens,
                                       BATCH_ALONE_KEY: CPU_BATCH_ALONE_TOKENS}
    own = engine_args(ModelConfig(**VLLM, batch_alone_prefill_tokens=64), tmp_path, {})
    assert own.additional_config[BATCH_ALONE_KEY] == 64


@pytest.mark.parametrize("bad", [0, 15, -1, 10**9])
def test_an_unusable_budget_is_refused(bad: int) -> None:
    with pytest.raises(ValidationError):
        ModelConfig(**VLLM, max_num_batched_tokens=bad)
