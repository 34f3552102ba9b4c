"""`tokenq bench mixed` in smoke mode: on its own stack it produces every figure (what
the figures are is for docs/benchmarks.md, not a test)."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console

from tests.conftest import SMOL
from tokenq.cli.bench.mixed import MixedConfig, arrival_times, run_mixed
from tokenq.shared.settings import Settings


def test_arrivals_are_poisson_and_the_same_each_run() -> None:
    cfg = MixedConfig(arrivals=50, rate=2.0)
    times = arrival_times(cfg)
    assert times == arrival_times(cfg) and len(times) == 50 and times[0] == 0.0
    assert times == sorted(times) and 10 < times[-1] < 60  # mean gap 0.5 s


def test_mixed_bench_produces_figures(tmp_path: Path) -> None:
    settings = Settings(redis_url=None, state_dir=tmp_path)
    out = run_mixed(settings, SMOL, MixedConfig.quick(), Console(quiet=True))
    (tokenq,) = out["results"]  # quick: no peers
    assert tokenq["server"] == "tokenq" and tokenq["errors"] == 0
    for key in ("idle_ttft_p50_ms", "idle_ttft_p95_ms", "batch_alone_tok_s",
                "batch_mixed_tok_s", "batch_ratio"):
        assert math.isfinite(tokenq[key]) and tokenq[key] > 0, key
    # the arrivals land while the batch runs (a 64-token batch outlasts them by far)
    assert tokenq["interactive_measured"] >= 1
    assert math.isfinite(tokenq["mixed_ttft_p95_ms"]) and tokenq["ttft_p95_ratio"] > 0
