"""`tokenq bench mixed --vllm` in smoke mode: tokenq's vLLM worker goes through the three
phases and produces every figure (what the figures are is for docs/benchmarks.md, not a
test). It runs the suite's tiny model (tests/vllm/tiny_model.py), already a Hugging Face
folder: SmolLM2 would first be converted from its GGUF, and its phases took ~40 s on a
2-core machine, for the same code path. The peers are left out here: each is one more
vLLM engine start. `vllm serve`'s start is tested in test_conformance.py, the peers'
requests (a streamed /v1/completions) in tests/integration/test_bench.py, and their three
phases are the same `measure` as tokenq's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from rich.console import Console

from tests.vllm.conftest import TINY
from tokenq.cli.bench.mixed import MixedConfig, run_mixed
from tokenq.shared.settings import Settings

pytestmark = pytest.mark.vllm


@pytest.mark.timeout(600)  # one vLLM engine start, then three short phases
def test_mixed_bench_on_vllm_produces_figures(vllm_settings: Settings, state_dir: Path) -> None:
    # The tiny model's entry, on a stack and Redis of the bench's own (redis_url None): the
    # suite's vLLM stack serves the same model name on the session's Redis.
    settings = Settings(redis_url=None, state_dir=state_dir,
                        models_file=vllm_settings.models_file)
    out = run_mixed(settings, TINY, MixedConfig.quick(), Console(quiet=True), vllm=True)
    assert [r["server"] for r in out["results"]] == ["tokenq"]
    fig = out["results"][0]
    assert fig["errors"] == 0, fig
    for key in ("idle_ttft_p50_ms", "batch_alone_tok_s", "batch_mixed_tok_s"):
        assert math.isfinite(fig[key]) and fig[key] > 0, key
