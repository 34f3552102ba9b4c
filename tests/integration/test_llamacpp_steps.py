"""The llama.cpp engine's step plan on a real model: which rows go into each llama_decode
(slot order, whole and chunked prompts, batch jobs' prompts and streams, a held slot)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp as ll
import pytest

from tests.integration.test_llamacpp_engine import PROMPTS, Collector, request, start_engine
from tokenq.workers.engines.llamacpp import LlamaCppEngine


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The sequence id of every row of every llama_decode call from now on."""
    real = ll.llama_decode
    seen: list[list[int]] = []

    def spy(ctx: object, batch: ll.llama_batch) -> int:
        seen.append([batch.seq_id[i][0] for i in range(batch.n_tokens)])
        return int(real(ctx, batch))

    monkeypatch.setattr(ll, "llama_decode", spy)
    return seen


def test_every_step_lists_its_sequences_in_id_order(tmp_path: Path,
                                                    steps: list[list[int]]) -> None:
    """With a KV stream per slot, llama.cpp makes one pass of a step only over sequence ids
    that run consecutively upwards, and splits it everywhere else. Rows in the order jobs
    arrived made every 8-stream step two to four passes, twice as slow (docs/benchmarks.md)."""
    eng, col = start_engine(tmp_path, prefix_cache=True)
    try:
        # 12 jobs of 4 lengths on 4 slots: slots free, and are taken again, out of order
        ids = [f"order-{i}" for i in range(12)]
        for i, job_id in enumerate(ids):
            eng.submit(request(job_id, PROMPTS[i % 8], max_tokens=3 + 9 * ((i * 5) % 4)))
        col.wait(ids)
    finally:
        eng.close()
    shared = [s for s in steps if len(set(s)) > 1]
    assert len(shared) > 20, steps
    assert all(s == sorted(s) for s in shared), [s for s in shared if s != sorted(s)][:3]


def test_short_prompts_go_whole_and_long_ones_in_chunks(tmp_path: Path,
                                                        steps: list[list[int]]) -> None:
    """Beside decoding streams, a prompt of at most prefill_whole_tokens is prefilled in one
    step (as llama-server does), and a longer one in chunks (the streams keep moving)."""
    eng, col = start_engine(tmp_path, n_parallel=3, prefill_whole_tokens=128)
    try:
        for job_id in ("stream-1", "stream-2"):  # slots 0 and 1 decode throughout
            eng.submit(request(job_id, PROMPTS[0], max_tokens=2000))
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("stream-2", [])) > 2, 60)

        def prefill_steps(job_id: str, prompt: str) -> list[int]:
            """Rows of slot 2 (the lowest free one) in each step that prefilled the job."""
            start = len(steps)
            eng.submit(request(job_id, prompt, max_tokens=2))
            col.wait([job_id])
            return [n for s in steps[start:] if (n := s.count(2)) > 1]

        short = prefill_steps("short", PROMPTS[3])
        long = prefill_steps("long", " ".join(PROMPTS) * 4)
        assert len(short) == 1, short  # the whole prompt in one step
        assert len(long) > 1 and sum(long) > 128, long  # chunked
        assert all(n < sum(long) for n in long)
    finally:
        eng.cancel("stream-1")
        eng.cancel("stream-2")
        col.wait(["stream-1", "stream-2"])
        eng.close()


def test_a_long_prompt_beside_one_stream_is_not_one_step(tmp_path: Path,
                                                         steps: list[list[int]]) -> None:
    """Counted in jobs, one tenant's long prompt beside another tenant's single stream was
    a burst (as many wait for a first token as decode): its whole prompt went into one
    step, and the stream stood still for all of its prefill. Steps beside a watched stream
    now stop at prefill_burst_s (UNMEASURED_BURST tokens before a prompt token's cost is
    measured)."""
    eng, col = start_engine(tmp_path, n_parallel=2)
    try:
        eng.submit(request("stream", PROMPTS[0], max_tokens=2000))  # slot 0
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("stream", [])) > 2, 60)
        beside = len(steps)
        eng.submit(request("long", " ".join(PROMPTS) * 10, max_tokens=2))  # slot 1
        col.wait(["long"])
    finally:
        eng.cancel("stream")
        col.wait(["stream"])
        eng.close()
    chunks = [n for s in steps[beside:] if (n := s.count(1)) > 1]
    assert len(chunks) > 1 and sum(chunks) > 400, chunks  # the prompt, in several steps
    assert all(0 in s for s in steps[beside:] if s.count(1) > 1)  # the stream in each


def test_batch_prompts_go_in_bounded_chunks_only_beside_other_jobs(
        tmp_path: Path, steps: list[list[int]]) -> None:
    """A low-priority (background) prompt goes into one step whole while nothing but
    batch jobs is on the engine (an interactive arrival stops such a step), and in chunks
    of at most batch_prefill_tokens (or the learned chunk) while a job that is not a batch
    job runs: the step running when an interactive job arrives must end soon."""
    eng, col = start_engine(tmp_path, prefix_cache=False)
    prompt = " ".join(PROMPTS) * 2
    try:
        alone = request("alone", prompt, max_tokens=4)  # slot 0
        alone.background = True
        eng.submit(alone)
        col.wait(["alone"])
        eng.submit(request("stream", PROMPTS[0], max_tokens=2000))  # slot 0 again
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("stream", [])) > 2, 60)
        beside = len(steps)
        batch = request("batch", prompt, max_tokens=4)  # slot 1
        batch.background = True
        eng.submit(batch)
        col.wait(["batch"])
    finally:
        eng.cancel("stream")
        col.wait(["stream"])
        eng.close()
    assert max(len(s) for s in steps[:beside] if set(s) == {0}) > 100  # alone: one step
    chunks = [n for s in steps[beside:] if (n := s.count(1)) > 1]
    assert len(chunks) > 1 and max(chunks) < 100 < sum(chunks), chunks


def test_a_held_slot_waits_for_its_job_to_join_the_next_step(tmp_path: Path,
                                                             steps: list[list[int]]) -> None:
    """Preemption frees a slot for an interactive job still on its way (its task is being
    fetched). With hold(), the engine publishes the cancel and starts no step until that
    job arrives, so it is prefilled in the very next step; a hold nobody fills ends by
    itself and the streams go on."""
    eng, col = start_engine(tmp_path, n_parallel=2)
    try:
        for job_id in ("victim", "stream"):
            eng.submit(request(job_id, PROMPTS[0], max_tokens=2000))
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("stream", [])) > 2, 60)
        eng.cancel("victim")
        eng.hold(30.0)
        col.wait(["victim"])
        held_at = len(steps)
        time.sleep(1.0)  # the job is on its way: nothing runs meanwhile
        assert len(steps) <= held_at + 1, steps[held_at:]  # at most the step under way
        before = len(steps)
        eng.submit(request("urgent", PROMPTS[1], max_tokens=2))
        col.wait(["urgent"])
        assert len(set(steps[before])) == 2 and len(steps[before]) > 2  # prefill + stream
        eng.hold(0.3)  # a hold nobody fills (urgent is done, its slot free)
        got = len(col.ids["stream"])
        with col.cond:  # the stream goes on once the hold ends
            assert col.cond.wait_for(lambda: len(col.ids["stream"]) > got + 5, 30)
    finally:
        eng.close()


def test_batch_streams_sit_out_the_step_that_prefills_an_interactive_prompt(
        tmp_path: Path, steps: list[list[int]]) -> None:
    """On a CPU, a step that prefills a prompt and decodes the batch's streams costs what
    the two steps would apart: the interactive prompt goes in without the batch's rows (a
    stream someone watches stays in), and they are back in the very next step."""
    eng, col = start_engine(tmp_path, n_parallel=4)
    try:
        for job_id in ("batch-0", "batch-1", "watched"):  # slots 0, 1, 2
            req = request(job_id, PROMPTS[0], max_tokens=2000)
            req.background = job_id != "watched"
            eng.submit(req)
        with col.cond:
            assert col.cond.wait_for(
                lambda: all(len(col.ids.get(j, [])) > 2 for j in ("batch-0", "batch-1")), 60)
        start = len(steps)
        urgent = request("urgent", PROMPTS[1], max_tokens=2)
        urgent.urgent = True
        eng.submit(urgent)
        col.wait(["urgent"])
    finally:
        eng.close()
    at = next(i for i in range(start, len(steps)) if steps[i].count(3) > 1)
    assert sorted(set(steps[at])) == [2, 3], steps[at]  # the prompt and the watched stream
    assert sorted(set(steps[at + 1])) == [0, 1, 2, 3], steps[at + 1]
    assert sorted(set(steps[at - 1])) == [0, 1, 2], steps[at - 1]


def alone_then_spy(eng: LlamaCppEngine, col: Collector, monkeypatch: pytest.MonkeyPatch,
                   during: Callable[[ll.llama_batch, int], None]) -> list[int]:
    """Run job "alone" (the reference text: PROMPTS[2], 24 tokens), then spy on every
    llama_decode: `during(batch, call)` runs inside call number `call` before llama.cpp
    computes (as if a message came while that step runs); returns their return codes."""
    eng.submit(request("alone", PROMPTS[2], max_tokens=24))
    col.wait(["alone"])
    real = ll.llama_decode
    codes: list[int] = []

    def spy(ctx: object, batch: ll.llama_batch) -> int:
        during(batch, len(codes))
        codes.append(int(real(ctx, batch)))
        return codes[-1]

    monkeypatch.setattr(ll, "llama_decode", spy)
    return codes


def test_a_hold_stops_the_step_under_way_and_no_text_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption's hold stops the batch's step under way (the interactive job then waits
    for no step to end): llama_decode returns 2, the step's KV cells are dropped and its
    tokens computed again in the next step, so a greedy stream's text is its text alone.
    A step that prefills a prompt someone waits for is not stopped."""
    eng, col = start_engine(tmp_path, n_parallel=2, prefix_cache=False)
    armed: list[int] = []  # the call at which the preemptor's messages go in

    def during(batch: ll.llama_batch, call: int) -> None:
        if armed and call == armed[0]:  # as if they came while this step runs
            eng.cancel("victim")
            eng.hold(30.0)
        elif armed and batch.n_tokens > 2:  # the urgent prompt's step: not to be stopped
            eng.hold(0.0)  # (by a second arrival's hold)

    try:
        codes = alone_then_spy(eng, col, monkeypatch, during)
        victim = request("victim", PROMPTS[0], max_tokens=2000)
        victim.background = True
        eng.submit(victim)
        eng.submit(request("stream", PROMPTS[2], max_tokens=24))
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("stream", [])) > 4, 60)
            armed.append(len(codes) + 1)
        col.wait(["victim"])
        eng.submit(request("urgent", PROMPTS[1], max_tokens=2))
        col.wait(["urgent", "stream"])
    finally:
        eng.close()
    assert codes.count(2) == 1 and eng.stats().stopped_steps == 1, codes
    assert col.finished["victim"].reason == "cancelled"
    assert col.output("stream") == col.output("alone")


def test_an_interactive_arrival_stops_a_step_of_batch_rows_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interactive job that finds a free slot while the step under way carries batch
    rows alone stops that step (its rows are computed again: a greedy batch stream's text
    is its text alone), and its prompt goes into the next step. A step that carries any
    other job's rows (here: the first interactive prompt) is not stopped by an arrival."""
    eng, col = start_engine(tmp_path, n_parallel=3, prefix_cache=False)
    armed: list[int] = []  # the call during which the interactive job arrives
    sent: list[str] = []

    def interactive(job_id: str) -> None:
        req = request(job_id, PROMPTS[1], max_tokens=2)
        req.urgent = True
        sent.append(job_id)
        eng.submit(req)

    def during(batch: ll.llama_batch, call: int) -> None:
        if armed and call == armed[0]:  # as if it came while this step runs
            interactive("urgent")
        elif sent == ["urgent"] and batch.n_tokens > 1:
            interactive("second")  # arrives during the first one's prompt step

    try:
        codes = alone_then_spy(eng, col, monkeypatch, during)
        batch = request("batch", PROMPTS[2], max_tokens=24)
        batch.background = True
        eng.submit(batch)
        with col.cond:
            assert col.cond.wait_for(lambda: len(col.ids.get("batch", [])) > 4, 60)
            armed.append(len(codes) + 1)
        col.wait(["urgent", "second", "batch"])
    finally:
        eng.close()
    assert codes.count(2) == 1 and eng.stats().stopped_steps == 1, codes
    assert col.output("batch") == col.output("alone")
