"""`tokenq bench --mixed --vllm` in smoke mode: tokenq's vLLM worker (with and without
preemption) and vLLM's own OpenAI server, each through the three phases, produce every
figure (what the figures are is for docs/benchmarks.md, not a test)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from cli.bench_mixed import MixedConfig, run_mixed
from shared.settings import Settings
from tests.conftest import SMOL

pytestmark = pytest.mark.vllm


@pytest.mark.timeout(900)  # three servers start, each with its own vLLM engine
def test_mixed_bench_on_vllm_produces_figures(vllm_importable: None,  # noqa: ARG001
                                              state_dir: Path) -> None:
    settings = Settings(redis_url=None, state_dir=state_dir)
    out = run_mixed(settings, SMOL, replace(MixedConfig.quick(), peers=True),
                    Console(quiet=True), vllm=True)
    servers = [r["server"] for r in out["results"]]
    assert servers == ["tokenq", "tokenq, preemption off", "vllm serve (FIFO)"]
    for fig in out["results"]:
        assert fig["errors"] == 0, fig
        for key in ("idle_ttft_p50_ms", "batch_alone_tok_s", "batch_mixed_tok_s"):
            assert math.isfinite(fig[key]) and fig[key] > 0, (fig["server"], key)
