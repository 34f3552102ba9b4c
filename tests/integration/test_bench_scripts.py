"""Smoke tests: the benchmark scripts behind docs/benchmarks.md run and print their figures
(what the figures are is for docs/benchmarks.md, not a test)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    out = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, check=True)
    return out.stdout


def test_step_gap_prints_the_gap_between_decodes() -> None:
    out = run("benchmarks/step_gap.py", "smollm2-135m-instruct")
    assert re.search(r"smollm2-135m-instruct: \d+ gaps between 8-stream decodes: median "
                     r"[\d.]+ ms, p90 [\d.]+ ms; decode median [\d.]+ ms", out), out
    out = run("benchmarks/step_gap.py", "smollm2-135m-instruct", "--streams", "2",
              "--rounds", "1", "--prompt-words", "20")  # the bench's prompts
    assert re.search(r"smollm2-135m-instruct: \d+ gaps between 2-stream decodes: median "
                     r"[\d.]+ ms", out), out  # seeded jobs: both run their 64 tokens


def test_thread_cpu_runs_with_nothing_to_watch() -> None:
    run("benchmarks/thread_cpu.py", "0.2")


def test_api_wakeups_prints_idle_and_streams() -> None:
    out = run("benchmarks/api_wakeups.py", "--streams", "5", "--window", "0.5",
              "--windows", "1")
    assert re.search(r"^idle: +[\d.]+ wake-ups/s +[\d.]+ cores$", out, re.M), out
    assert re.search(r"^5 queued streams: +[\d.]+ wake-ups/s", out, re.M), out


def test_step_write_prints_a_step_writes_cost() -> None:
    out = run("benchmarks/step_write.py", "--steps", "50")
    assert re.search(r"50 single-token step writes: wall median \d+ us, CPU \d+ us a step",
                     out), out
    assert re.search(r"Redis: [\d.]+ us per script call \(5\d calls", out), out


def test_mixed_waits_splits_an_interactive_first_tokens_wait() -> None:
    out = run("benchmarks/mixed_waits.py", "smollm2-135m-instruct", "--quick")
    assert re.search(r"idle: 2 interactive jobs", out), out
    for part in (r"record to acquired \(slot wait\)", "acquired to first token in Redis",
                 "TTFT"):
        assert re.search(part + r" +median +\d+ \[\d+-\d+\]  p95 +\d+", out), out


def test_arrival_stop_prints_both_arms() -> None:
    out = run("benchmarks/arrival_stop.py", "smollm2-135m-instruct", "--arrivals", "2",
              "--batch", "1")
    for arm in ("on", "off"):
        assert re.search(rf"arrival stop {arm}: 1 arrivals beside 1 batch streams, submit -> "
                         rf"first token median \d+ ms \[\d+-\d+\], p90 \d+ ms; \d+ steps "
                         rf"stopped", out), out


def test_placement_posts_prints_the_submit_rate_with_and_without_the_order() -> None:
    for flag, on in (((), "True"), (("--no-order",), "False")):
        out = run("benchmarks/placement_posts.py", "--posts", "40", "--runs", "1", *flag)
        assert re.search(rf"placement_in_order={on}: median \d+ POST/s", out), out
        assert "{202: 40}" in out, out


def test_worker_stop_prints_how_long_an_idle_worker_took_to_exit() -> None:
    out = run("benchmarks/worker_stop.py", "--runs", "1")
    assert re.search(r"an idle worker exited \d+\.\d\d s after SIGTERM \(median", out), out


def test_batch_cancel_memory_prints_bytes_a_line() -> None:
    out = run("benchmarks/batch_cancel_memory.py", "200")
    assert re.search(r"^cancelled .*total=200\): swept in [\d.]+ s, Redis memory "
                     r"\+-?[\d.]+ MB, -?\d+ bytes a line$", out, re.M), out


def test_prefill_burst_prints_both_arms() -> None:
    out = run("benchmarks/prefill_burst.py", "--runs", "1", "--prompt-words", "150")
    assert "burst_s 0.5: B's worst gap" in out and "whole prompt (old rule)" in out
