"""The chunked-prefill budget against a simulated engine whose step cost is known."""

from __future__ import annotations

import pytest

from tokenq.workers.engines.budget import PrefillBudget, Want


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
    # a burst of arrivals beside two streams: whole prompts, but no step past burst_s
    burst = b.tokens(2, prefilling=6)
    assert 100 < burst < 510 and step_time(2, burst) <= b.burst_s
    assert b.tokens(2, prefilling=6, watched=False) == 510  # beside batch streams only
    assert b.tokens(4, prefilling=4, watched=False) == 508
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


def test_a_step_plan_gives_every_decoder_its_token_and_bursts_their_whole_prompts() -> None:
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8, background_tokens=64)
    decoding = [Want(1, prefilling=False)] * 2
    burst = [Want(100, prefilling=True, whole=True)] * 3  # as many wait as decode: whole
    # the costs not measured yet: UNMEASURED_BURST (128) tokens, the first prompt whole
    assert b.split(decoding + burst) == [1, 1, 100, 28, 0]
    long = [Want(300, prefilling=True)]  # the streams are the majority: a chunk
    assert b.split(decoding * 3 + long) == [1] * 6 + [8]
    batch_decoding = [Want(1, prefilling=False, background=True)] * 2
    assert b.split(batch_decoding + burst) == [0, 0, 100, 100, 100]  # nobody watches them
    roomy = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8, burst_s=5.0)
    roomy.observe(2, 0, step_time(2, 0))
    roomy.observe(2, 200, step_time(2, 200))  # measured: all three fit in 5 s
    assert roomy.split(decoding + burst) == [1, 1, 100, 100, 100]


def test_one_long_prompt_beside_one_watched_stream_keeps_the_step_within_burst_s() -> None:
    """Counted in jobs, one tenant's long prompt beside another tenant's one stream was a
    burst: the step took the whole prompt, and the stream stood still for all of its
    prefill (1,900 tokens: 29 s on a loaded 2-core VM)."""
    b = PrefillBudget(slots=8, n_batch=2048, itl_ratio=1.6, min_chunk=4)
    run(b, decoding=1, steps=30)
    stream, prompt = [Want(1, prefilling=False)], [Want(1900, prefilling=True)]
    took = b.split(stream + prompt)
    assert took[0] == 1 and 100 < took[1] < 1900
    assert step_time(1, took[1]) <= b.burst_s
    assert b.split(prompt) == [1900]  # nothing decoding: the whole prompt
    assert b.split([Want(1, prefilling=False, background=True), *prompt]) == [1, 1900]


def test_batch_prompts_fill_the_step_alone_and_go_in_bounded_chunks_beside_others() -> None:
    """With the batch alone on the engine its prompts fill the step (an interactive arrival
    stops such a step); beside streams someone watches they go in bounded chunks, and not
    at all beside another job's prompt."""
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8, background_tokens=64)
    batch = [Want(200, prefilling=True, background=True)] * 8
    assert b.split(batch) == [200, 200, 112] + [0] * 5  # alone on the engine: the step's 512
    batch_decoding = [Want(1, prefilling=False, background=True)] * 3
    assert b.split(batch_decoding + batch[:3]) == [1, 1, 1, 200, 200, 109]
    # beside a watched stream: a bounded chunk
    assert b.split([Want(1, prefilling=False)] * 3 + batch[:2]) == [1, 1, 1, 64, 0]
    # beside interactive prompts: those whole (or chunked), the batch's wait a step
    burst = [Want(50, prefilling=True, whole=True)] * 2
    assert b.split(burst + batch[:3]) == [50, 50, 0, 0, 0]
    assert b.split([Want(1, prefilling=False)] * 3 + [Want(300, prefilling=True)]
                   + batch[:1]) == [1, 1, 1, 8, 0]
    small = PrefillBudget(slots=8, n_batch=512, itl_ratio=3.0, min_chunk=8,
                          background_tokens=16)
    run(small, decoding=7, steps=40)  # a learned chunk above background_tokens is used
    assert small.chunk_tokens() > 16
    assert sum(small.split([Want(1, prefilling=False), *batch[:2]])) == (
        1 + small.chunk_tokens())


def test_batch_decoders_sit_out_the_step_of_a_whole_interactive_prompt() -> None:
    """On a CPU a prompt step beside the batch's decoders costs what the two steps would
    apart: the prompt goes in alone (the batch keeps its streams, one step later), never
    two steps running, and streams someone watches stay in."""
    b = PrefillBudget(slots=8, n_batch=512, itl_ratio=1.5, min_chunk=8)
    batch = [Want(1, prefilling=False, background=True)] * 6
    watched = [Want(1, prefilling=False)]
    prompt = [Want(40, prefilling=True, whole=True)]
    assert b.split(batch + watched + prompt) == [0] * 6 + [1, 40]
    assert b.split(batch + watched + prompt) == [1] * 7 + [40]  # not two steps running
    assert b.split(batch + watched) == [1] * 7
    assert b.split(batch + prompt) == [0] * 6 + [40]
    assert b.split(batch + prompt) == [1] * 6 + [40]
    # a batch prompt does not bench them, nor does a chunk of a long one
    assert b.split([*batch, Want(200, prefilling=True, background=True)]) == [1] * 6 + [200]
    assert b.split([*batch, Want(300, prefilling=True)]) == [1] * 6 + [8]
