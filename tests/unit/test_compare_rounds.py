"""`tokenq bench compare --rounds`: the medians and ranges it reports, and prompts that
differ between rounds (a server's prompt cache must not serve a later round)."""

from __future__ import annotations

from rich.console import Console

from tokenq.cli.bench.compare_rounds import ENGINE, PEER, TOKENQ, summarize
from tokenq.cli.bench.load import Level, prompt_text


def level(c: int, tok_s: float, ttft_ms: float) -> Level:
    return Level(concurrency=c, requests=4 * c, errors=0, wall_s=10.0, output_tok_s=tok_s,
                 ttft_p50_ms=ttft_ms, ttft_p95_ms=ttft_ms, itl_p50_ms=40.0, itl_p95_ms=50.0,
                 e2e_p50_ms=3000.0, e2e_p95_ms=3500.0, prompt_tokens=100.0)


def test_medians_and_ranges_of_paired_rounds() -> None:
    runs = {TOKENQ: {8: [level(8, 150, 800), level(8, 140, 900), level(8, 100, 700)]},
            PEER: {8: [level(8, 100, 700), level(8, 140, 800), level(8, 125, 800)]}}
    out = summarize(runs, [8], Console(quiet=True))
    row = out["levels"][0]
    assert row["ratio_median"] == 1.0  # ratios 1.5, 1.0, 0.8: each round's own pair
    assert (row["ratio_min"], row["ratio_max"]) == (0.8, 1.5)
    assert row["ttft_p50_diff_median_ms"] == 100
    assert (row["ttft_p50_diff_min_ms"], row["ttft_p50_diff_max_ms"]) == (-100, 100)
    assert row["tokenq_tok_s"] == 140 and row["peer_tok_s"] == 125
    assert len(out["rounds"][TOKENQ][8]) == 3


def test_the_engine_in_process_against_both() -> None:
    runs = {TOKENQ: {8: [level(8, 90, 900), level(8, 100, 800), level(8, 120, 700)]},
            PEER: {8: [level(8, 100, 700), level(8, 100, 800), level(8, 100, 800)]},
            ENGINE: {8: [level(8, 100, 600), level(8, 125, 700), level(8, 110, 700)]}}
    row = summarize(runs, [8], Console(quiet=True))["levels"][0]
    assert row["engine_tok_s"] == 110
    assert (row["engine_ratio_median"], row["engine_ratio_min"],
            row["engine_ratio_max"]) == (1.1, 1.0, 1.25)
    assert row["queue_path_ratio_median"] == 0.9  # 0.9, 0.8, 120/110: round by round
    assert row["queue_path_ratio_min"] == 0.8
    assert row["queue_path_ttft_p50_added_ms"] == 100  # 300, 100, 0
    assert row["ratio_median"] == 1.0  # the first table's figures are unchanged


def test_rounds_never_repeat_a_prompt() -> None:
    first = {prompt_text(i, 80, 8, "r0.") for i in range(32)}
    second = {prompt_text(i, 80, 8, "r1.") for i in range(32)}
    assert len(first) == 32 and not first & second
    assert prompt_text(3, 80, 8) == prompt_text(3, 80, 8, "")  # the plain bench is unchanged
