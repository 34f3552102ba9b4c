"""`tokenq bench` in smoke mode: it produces figures (not what they are)."""

from __future__ import annotations

import math
from pathlib import Path

from tests.conftest import GEMMA, SMOL
from tokenq.cli.bench.load import bench
from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings


def test_bench_smoke_produces_figures(stack: Stack) -> None:
    result = bench(stack.url, SMOL, [1, 2], requests=2, prompt_words=20, max_tokens=6,
                   budget_s=30, quiet=True)
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    for lv in result["levels"]:
        assert lv["errors"] == 0 and lv["requests"] == 2
        for key in ("output_tok_s", "ttft_p50_ms", "itl_p50_ms", "e2e_p95_ms"):
            assert lv[key] > 0 and math.isfinite(lv[key])
    assert any("prefill" in line for line in result["budget"])


def test_long_prompt_scenario_produces_figures(stack: Stack) -> None:
    from tokenq.cli.bench.load import long_prompt_impact

    # the two streams must still be decoding when the long prompt arrives and is prefilled
    # (Gemma, a base model, keeps writing; an instruct model may stop at once)
    out = long_prompt_impact(stack.url, GEMMA, streams=2, long_words=300, max_tokens=250,
                             settle_s=2.0)
    assert out["prompt_tokens"] > 250 and out["prefill_s"] > 0
    assert math.isfinite(out["itl_p95_before_ms"]) and math.isfinite(out["itl_p95_during_ms"])


def test_paired_ttft_produces_figures(tmp_path: Path) -> None:
    """`tokenq bench paired`: its own embedded stack (own Redis) beside an in-process
    engine, alternating jobs; it reports both TTFTs and their difference. With the CLI's
    prompts (80 words), SmolLM2's first sample for seed 1 was its end of text here: such a pair has
    no TTFT and is skipped, not a crash."""
    from tokenq.cli.bench.inprocess import paired_ttft

    settings = Settings(state_dir=tmp_path, redis_url=None)  # the stack starts its own Redis
    out = paired_ttft(settings, SMOL, pairs=2, prompt_words=80, max_tokens=4)
    assert out["pairs"] == 2 and out["skipped"] >= 0
    for key in ("inprocess_ttft_p50_ms", "tokenq_ttft_p50_ms"):
        assert out[key] > 0 and math.isfinite(out[key])
    assert math.isfinite(out["added_p50_ms"]) and math.isfinite(out["added_mean_ms"])


def test_the_inprocess_peer_produces_figures(tmp_path: Path) -> None:
    """`tokenq bench compare --rounds N --inprocess`'s third peer: the engine fed from
    client threads, a level per call (salted prompts, as the rounds send them)."""
    from tokenq.cli.bench.inprocess import InProcess

    peer = InProcess(Settings(state_dir=tmp_path, redis_url=None), SMOL)
    try:
        for salt in ("r0.", "r1."):
            lv = peer.run_level(2, 3, prompt_words=20, max_tokens=4, salt=salt)
            assert (lv.requests, lv.errors) == (3, 0)
            assert lv.output_tok_s > 0 and lv.ttft_p50_ms > 0 and math.isfinite(lv.itl_p50_ms)
    finally:
        peer.close()


def test_openai_peer_path_produces_figures(stack: Stack) -> None:
    """The path every peer is measured through (a streamed /v1/completions), here against
    tokenq's own OpenAI surface: llama-server and `vllm serve` take the same requests."""
    from tokenq.cli.bench.load import run_level

    level = run_level(stack.url, SMOL, 2, 2, prompt_words=20, max_tokens=6, api="openai")
    assert level.errors == 0 and level.requests == 2
    for value in (level.output_tok_s, level.ttft_p50_ms, level.e2e_p95_ms):
        assert value > 0 and math.isfinite(value)
