"""The llama.cpp engine's step sampler (a step's rows split over two threads, in order) and
the worker's OpenMP setting that leaves the second core free between decodes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from tokenq.workers.engines import llamacpp_sampling
from tokenq.workers.engines.llamacpp_sampling import StepSampler


class FakeSampler:
    def __init__(self, fast: str | None = None) -> None:
        self.threads: list[str] = []
        self.fast = fast

    def sample(self, ctx: Any, row: int) -> int:
        assert ctx == "ctx"
        self.threads.append(threading.current_thread().name)
        return row * 10


@pytest.fixture(autouse=True)
def no_llama_logits(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(llamacpp_sampling.ll, "llama_get_logits", calls.append)
    return calls


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_split_keeps_the_rows_order_and_uses_the_helper_for_the_later_half(
        n: int, no_llama_logits: list[Any]) -> None:
    step = StepSampler(split=True)
    try:
        samplers = [FakeSampler() for _ in range(n)]
        assert step.sample("ctx", [(s, i) for i, s in enumerate(samplers)]) == [
            10 * i for i in range(n)]
        names = [s.threads[0] for s in samplers]
        here = threading.current_thread().name
        if n == 1:
            assert names == [here] and no_llama_logits == []
        else:
            half = (n + 1) // 2
            assert names[:half] == [here] * half
            assert all(name.startswith("llama-sample") for name in names[half:])
            assert no_llama_logits == ["ctx"]  # outputs reordered once, before the threads
    finally:
        step.close()


def test_without_a_second_core_every_row_is_sampled_here(no_llama_logits: list[Any]) -> None:
    step = StepSampler(split=False)
    samplers = [FakeSampler() for _ in range(4)]
    assert step.sample("ctx", [(s, i) for i, s in enumerate(samplers)]) == [0, 10, 20, 30]
    assert {s.threads[0] for s in samplers} == {threading.current_thread().name}
    assert no_llama_logits == []
    step.close()


def test_fast_draws_stay_here_and_the_full_reads_are_split(
        no_llama_logits: list[Any]) -> None:
    """A fast draw (a dozen short numpy calls) on the engine's thread; the rows that take
    llama.cpp's full read split in halves as before; the step's order kept."""
    step = StepSampler(split=True)
    try:
        kinds = ["top_k", None, "greedy", None, None, "top_k", None]
        samplers = [FakeSampler(k) for k in kinds]
        assert step.sample("ctx", [(s, i) for i, s in enumerate(samplers)]) == [
            10 * i for i in range(len(kinds))]
        here = threading.current_thread().name
        on_helper = [i for i, s in enumerate(samplers) if s.threads[0] != here]
        assert on_helper == [4, 6]  # the later half of the full reads (rows 1, 3, 4, 6)
        assert no_llama_logits == ["ctx"]
        fast_only = [FakeSampler("top_k") for _ in range(4)] + [FakeSampler(None)]
        step.sample("ctx", [(s, i) for i, s in enumerate(fast_only)])
        assert {s.threads[-1] for s in fast_only} == {here}  # one full read: not split
    finally:
        step.close()


def test_a_failing_row_fails_the_step_after_the_helper_is_done() -> None:
    class Boom(FakeSampler):
        def sample(self, ctx: Any, row: int) -> int:
            raise RuntimeError(f"row {row} of {ctx} failed")

    step = StepSampler(split=True)
    later = FakeSampler()
    with pytest.raises(RuntimeError, match="row 0 of ctx failed"):
        step.sample("ctx", [(Boom(), 0), (later, 1)])
    assert later.threads  # the helper's half ran to its end before the step failed
    step.close()


def test_the_worker_lets_idle_compute_threads_sleep_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenq.workers.main import OPENMP_SPINS, idle_compute_threads_sleep

    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.setenv(name, "")  # recorded, so whatever the function sets is undone
        monkeypatch.delenv(name)
    idle_compute_threads_sleep()
    assert os.environ["GOMP_SPINCOUNT"] == str(OPENMP_SPINS)
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")  # an operator's value stays
    idle_compute_threads_sleep()
    assert os.environ["GOMP_SPINCOUNT"] == "5"
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # and so does a wait policy
    idle_compute_threads_sleep()
    assert "GOMP_SPINCOUNT" not in os.environ


def test_the_worker_sets_it_before_llama_cpp_loads() -> None:
    """libgomp reads its settings once, when llama.cpp's library loads: the worker's command
    must get to run_worker (which sets them) without having imported llama_cpp."""
    code = ("import sys, tokenq.cli.main, tokenq.workers.main; "
            "sys.exit('llama_cpp' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
