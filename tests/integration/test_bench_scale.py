"""`tokenq bench scale` in smoke mode: on its own stack it produces every figure, and no
token and no job is lost (what the figures are is for docs/benchmarks.md, not a test)."""

from __future__ import annotations

import math
from pathlib import Path

from tokenq.cli.bench.scale import ScaleConfig, run_scale


def test_scale_bench_produces_figures_and_loses_nothing(tmp_path: Path) -> None:
    cfg = ScaleConfig(clients=6, token_rate=120.0, stream_s=1.0, posts=12, concurrency=4,
                      backlog=40, drain_slots=8, drain_limit_s=240.0)
    lines: list[str] = []
    out = run_scale(cfg, lines.append, state_dir=tmp_path)

    sse = out["sse"]
    assert sse["subscribed"] == sse["ended"] == 6 and sse["errors"] == 0
    assert sse["tokens_written"] > 0 and sse["lost"] == 0
    for key in ("tok_s", "latency_p50_ms", "latency_p99_ms", "api_cpu_s_per_1k_tok"):
        assert math.isfinite(sse[key]) and sse[key] >= 0, key
    xread = sse["redis_commands"]["xread"]  # the shared reader's cost inside Redis
    assert xread["per_s"] > 0 and xread["us_per_call"] > 0
    assert any("Redis' time by command: " in line and "XREAD" in line for line in lines)
    relay = sse["relay"]  # the same traffic from the minimal relay: the API's bound
    assert relay["tokens_written"] > 0 and relay["lost"] == relay["errors"] == 0
    assert relay["relay_cpu_s_per_1k_tok"] > 0 and relay["api_over_relay"] > 0

    posts = out["posts"]
    assert posts["accepted"] == 12 and posts["posts_s"] > 0 and posts["deletes_s"] > 0

    backlog = out["backlog"]
    assert backlog["succeeded"] == 40
    assert backlog["lost"] == backlog["unfinished"] == backlog["not_exactly_once"] == 0
    assert backlog["drain_jobs_s"] > 0 and backlog["enqueue_lines_s"] > 0

    for key in ("queued_job_bytes", "queued_batch_line_bytes", "finished_batch_line_bytes",
                "finished_job_bytes"):
        assert math.isfinite(out["memory"][key]), key
    assert any("bound:" in line for line in lines)
    assert lines[-1].startswith("done in")
