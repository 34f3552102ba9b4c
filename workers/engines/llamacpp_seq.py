"""A job's sequence in the llama.cpp engine, and how a request's n choices share one prefill.

Part of the llama.cpp engine (llamacpp.py). The n choices of a request are n jobs with
the same input: the first one admitted prefills it; one admitted while that prefill is
under way waits, then takes a copy of the leader's KV (seq_cp) and samples its first
token from the leader's last prompt row; one admitted later copies the KV and decodes
only the prompt's last token again (for fresh logits).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as ll

from tokenq.workers.engines.base import EngineRequest
from tokenq.workers.engines.detok import TextStream
from tokenq.workers.engines.llamacpp_lora import BASE
from tokenq.workers.engines.llamacpp_sampling import Sampler


@dataclass(eq=False)
class Seq:
    req: EngineRequest
    seq_id: int
    tokens: list[int]  # prompt (+ resumed tokens) still to prefill, then fed back one by one
    n_prompt: int
    sampler: Sampler
    text: TextStream
    n_past: int = 0
    generated: int = 0
    emitted: int = 0
    history: list[int] = field(default_factory=list)
    group: int = BASE  # LoRA version id the job's KV is computed with
    logprobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # token index -> entry
    # A job with the same input admitted while this one's prompt is still being prefilled
    # (the n choices of one request): it waits, then takes a copy of the leader's KV and
    # samples its first token from the leader's last prompt row.
    leader: Seq | None = None
    # sits out steps until then (monotonic) for its whole-vocabulary grammar passes
    rest_until: float = 0.0

    @property
    def prefilling(self) -> bool:
        return len(self.tokens) > 1 or self.n_past == 0


def find_leader(active: Iterable[Seq], tokens: list[int], group: int) -> Seq | None:
    """An active job with the same input: one still prefilling it (nothing sampled yet:
    wait for it), else one whose KV holds all of it."""
    found = None
    for seq in active:
        if seq.leader is not None or seq.group != group:
            continue
        if seq.history == tokens:
            return seq
        if seq.history[:len(tokens)] == tokens and seq.n_past >= len(tokens):
            found = seq
    return found


def share_prefill(mem: Any, active: Iterable[Seq], seq_id: int, tokens: list[int],
                  group: int, reused: int) -> tuple[int, Seq | None]:
    """For a job about to run `tokens` in slot `seq_id` with `reused` cached cells: an
    active job with the same input shares its KV. Returns the cells now reused and the
    leader to wait for (None: nothing to wait for)."""
    leader = find_leader(active, tokens, group)
    if leader is None:
        return reused, None
    ll.llama_memory_seq_rm(mem, seq_id, -1, -1)
    if leader.history[:len(tokens)] == tokens and leader.n_past >= len(tokens):
        # It is past its prompt already: copy its KV, drop what it generated after the
        # prompt and the prompt's last cell (decoded again for logits).
        ll.llama_memory_seq_cp(mem, leader.seq_id, seq_id, -1, -1)
        reused = len(tokens) - 1
        ll.llama_memory_seq_rm(mem, seq_id, reused, -1)
        return reused, None
    return 0, leader


def fork(mem: Any, active: Iterable[Seq], rows: list[tuple[Seq, int]]) -> list[tuple[Seq, int]]:
    """Followers of a leader whose whole input went in this step get a copy of its KV
    (the whole sequence: across per-slot KV streams llama.cpp copies only whole
    sequences) and sample from its row."""
    done = {id(seq): row for seq, row in rows}
    forked = []
    for f in active:
        if f.leader is not None and id(f.leader) in done:
            ll.llama_memory_seq_cp(mem, f.leader.seq_id, f.seq_id, -1, -1)
            f.n_past, f.tokens = f.leader.n_past, []
            forked.append((f, done[id(f.leader)]))
            f.leader = None
    return forked


def undo(mem: Any, plan: list[tuple[Seq, list[int]]]) -> None:
    """A step that was stopped (llama_decode returned 2): each sequence's input back as it
    was, and its KV cells from the step's first position dropped (llama.cpp dropped those
    of the ubatch it stopped in, not those of any before it)."""
    for seq, take in plan:
        seq.n_past -= len(take)
        seq.tokens = take + seq.tokens
        ll.llama_memory_seq_rm(mem, seq.seq_id, seq.n_past, -1)


# A job whose grammar needed a whole-vocabulary pass (a refused token LikelyFirst could not
# redraw exactly: sampling without top-k, or a penalty that may raise a logit) sits out
# steps for REST_FACTOR times that pass's time, times the jobs resting: whatever their
# number, such passes take at most about 1/REST_FACTOR of the engine's time, and every
# other job keeps most of its pace (the pass runs on the engine's thread, in every job's
# step). A job that needs one now and then (40-80 ms) misses a step or two.
REST_FACTOR = 2.0


def rest_after_slow(seqs: Sequence[Seq], now: float) -> None:
    slow = [s for s in seqs if s.sampler.slow_s > 0.0]
    if not slow:
        return
    resting = sum(1 for s in seqs if s.rest_until > now or s.sampler.slow_s > 0.0)
    for s in slow:
        s.rest_until = now + REST_FACTOR * s.sampler.slow_s * resting
        s.sampler.slow_s = 0.0


def awake(seqs: Iterable[Seq], now: float) -> list[Seq]:
    """The jobs that take part in this step: those not resting, or all when every one
    is (resting only ever yields the engine to others)."""
    seqs = list(seqs)
    up = [s for s in seqs if s.rest_until <= now]
    return up or seqs
