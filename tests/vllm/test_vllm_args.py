"""A model config's step budget reaches vLLM (`max_num_batched_tokens`), for tokenq's vLLM
worker and the bench's `vllm serve` peer alike; left unset, vLLM keeps its own default."""

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
    from tokenq.workers.engines.vllm_args import engine_args

    cfg = ModelConfig(**VLLM, max_num_batched_tokens=256)
    assert engine_args(cfg, tmp_path, {}).max_num_batched_tokens == 256
    assert engine_args(ModelConfig(**VLLM), tmp_path, {}).max_num_batched_tokens is None
    args = vllm_server_args(str(tmp_path), "m", cfg, 8000)
    assert args[args.index("--max-num-batched-tokens") + 1] == "256"
    assert "--max-num-batched-tokens" not in vllm_server_args(
        str(tmp_path), "m", ModelConfig(**VLLM), 8000)


@pytest.mark.parametrize("bad", [0, 15, -1, 10**9])
def test_an_unusable_budget_is_refused(bad: int) -> None:
    with pytest.raises(ValidationError):
        ModelConfig(**VLLM, max_num_batched_tokens=bad)
