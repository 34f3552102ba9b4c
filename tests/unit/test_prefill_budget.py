"""The chunked-prefill budget against a simulated engine whose step cost is known."""

from __future__ import annotations

import pytest

from workers.engines.budget import PrefillBudget


def step_time(decoding: int, prompt: int) -> float:
    """Shaped like llama.cpp with per-sequence KV on this CPU: 4 ms per step, 10 ms per
    decode token, and a prompt chunk that costs a pass of its own (12 ms) plus tokens that
    get cheaper per token the more of them share the pass."""
    return 0.004 + 0.010 * decoding + (0.012 + 0.0025 * prompt ** 0.75 if prompt else 0.0)


def run(budget: PrefillBudget, decoding: int, steps: int) -> list[int]:
    """Alternate decode-only and mixed steps the way a busy engine does, one prompt
    waiting beside `decoding` streams."""
    chunks = []
    for _ in range(steps):
        budget.observe(decoding, 0, step_time(decoding, 0))
        chunk = budget.tokens(decoding, prefilling=1)
        chunks.append(chunk)
        budget.observe(decoding, chunk, step_time(decoding, chunk))
    return chunks


def test_whole_prompts_while_as_many_wait_for_a_first_token_as_decode() -> None:
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8)
    run(b, decoding=7, steps=30)
    assert b.tokens(0, prefilling=1) == 512
    assert b.tokens(2, prefilling=6) == 510  # a burst of arrivals beside two streams
    assert b.tokens(4, prefilling=4) == 508
    assert b.tokens(5, prefilling=3) < 100  # the streams are the majority: chunked


def test_unmeasured_engine_takes_the_minimum_chunk() -> None:
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8)
    assert b.tokens(7, prefilling=1) == 8
    b.observe(7, 0, 0.074)  # a decode-only step alone says nothing about prompt cost
    assert b.tokens(7, prefilling=1) == 8


@pytest.mark.parametrize("ratio", [1.5, 2.0, 3.0])
def test_chunks_settle_on_the_largest_that_keeps_the_step_within_the_ratio(
        ratio: float) -> None:
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=ratio, min_chunk=8)
    chunks = run(b, decoding=7, steps=40)
    assert chunks[0] == 8 and chunks[-1] > 8
    achieved = step_time(7, chunks[-1]) / step_time(7, 0)
    assert ratio * 0.93 <= achieved <= ratio * 1.03, (chunks, achieved)
    assert step_time(7, int(chunks[-1] * 1.15) + 1) / step_time(7, 0) > ratio


def test_a_ratio_that_no_chunk_can_meet_keeps_the_minimum_chunk() -> None:
    # the pass of its own alone costs 12 / 74 ms = 1.16x a decode-only step
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.1, min_chunk=8)
    assert run(b, decoding=7, steps=30)[-1] == 8


def test_the_budget_follows_the_streams_decode_step() -> None:
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=2.0, min_chunk=8)
    seven = run(b, decoding=7, steps=40)[-1]
    three = run(b, decoding=3, steps=40)[-1]  # shorter steps: a smaller chunk delays them
    assert 8 <= three < seven
    # a count never measured is scaled from the nearest one measured (the lower on a tie)
    assert b.decode_time(5) == pytest.approx(step_time(3, 0) * 5 / 3)
    assert b.decode_time(8) == pytest.approx(step_time(7, 0) * 8 / 7)


def test_room_short_tails_and_stalls() -> None:
    b = PrefillBudget(slots=8, n_batch=64, itl_ratio=4.0, min_chunk=8)
    run(b, decoding=7, steps=40)
    assert b.tokens(7, prefilling=1) == 64 - 7  # never more than the batch holds
    settled = b.chunk
    b.observe(7, 2, step_time(7, 2))  # a prompt's last 2 tokens: not a chunk's cost
    b.observe(7, 0, 100 * step_time(7, 0))  # a frozen VM, not the engine
    b.observe(7, 40, 100 * step_time(7, 40))
    assert b.chunk == settled
