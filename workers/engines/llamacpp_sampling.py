"""Per-sequence sampling for the llama.cpp engine (part of it: the only other llama_cpp user).

One `Sampler` per in-flight job: a llama.cpp sampler chain (penalties, top-k,
top-p, temperature, seeded dist, or greedy) plus, for structured output, a
grammar compiled from the job's JSON schema.

Why the grammar is not simply the chain's first link: applied to every one of
the vocabulary's 49k-262k candidates each step, it costs more than the decode itself
for a small model. llama.cpp's own server avoids that, and so do we:
sample without the grammar, check only the chosen token against it, and
constrain the draw only when that token is rejected, which is rare once the model
follows the format; even then over the likeliest 1,024 candidates first when that is
provably the same draw (`LikelyFirst`), so a job cannot make every step pay the whole
vocabulary's pass (a logit bias on a token its schema refuses did).

Why the chain usually reads a hundred candidates, not the vocabulary: llama.cpp's
`llama_sampler_sample` copies a sequence's whole row of logits (Gemma: 262k, 3 MB as
candidates) before top-k cuts it to k. With top-k on and nothing before it in the chain
that changes a logit (bias, penalties, grammar), the chain is given only the logits that
can be among the k highest (`top_k_candidates`: a dozen numpy calls, 0.08 ms against the
copy's 0.21 ms in a warm loop on the 2-core VM) and draws the same token from the same k;
greedy is numpy's argmax, the first highest logit, as llama.cpp's greedy takes it.
"""

from __future__ import annotations

import ctypes
import math
import random
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llama_cpp as ll
import numpy as np

from tokenq.shared.json_grammar import schema_gbnf
from tokenq.shared.schemas import SamplingParams
from tokenq.shared.vocab import Vocab
from tokenq.workers.engines import logprobs

# Tokens the repetition/frequency/presence penalties look back over (llama-server's
# default window).
PENALTY_LAST_N = 64

# top_k_candidates: logits per block (the row is read once for the blocks' maxima, then
# only the blocks that can hold one of the k highest), and the most candidates a draw hands
# to llama.cpp's chain (a row that yields more, or a vocabulary of fewer than 4k blocks,
# takes the chain's own full read)
BLOCK = 512
FAST_CANDIDATES = 2048
# A refused token's second draw: the candidates the grammar is first applied to
# (LikelyFirst), more than a logit bias may name (300) and top-k's k.
LIKELY = 1024


def compile_grammar(vocab: Any, schema: dict[str, Any]) -> Any:
    """The llama.cpp grammar sampler of a JSON schema (the caller frees it). A schema past
    the API's budgets can crash the process here (docs/reliability.md)."""
    gbnf = schema_gbnf(schema)
    grammar = ll.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not grammar:
        raise ValueError("llama.cpp could not compile the grammar for this JSON schema")
    return grammar


def top_k_candidates(logits: Any, k: int) -> Any:
    """The ids (ascending) of every logit at least as high as the k-th highest, and maybe a
    few more; None when there are more than FAST_CANDIDATES of them, or fewer than k (NaN).

    Each of the k blocks with the highest maxima holds a logit at least as high as the k-th
    highest block maximum `floor`: at least k logits reach `floor`, so the k-th highest
    logit does too, and every logit above or tied with it is found by reading only the blocks
    whose maximum reaches `floor` (and the row's tail past the last whole block)."""
    n_blocks = logits.shape[0] // BLOCK
    blocks = logits[:n_blocks * BLOCK].reshape(n_blocks, BLOCK)
    maxima = blocks.max(axis=1)
    floor = np.partition(maxima, n_blocks - k)[n_blocks - k]
    hot = np.flatnonzero(maxima >= floor)
    at = np.flatnonzero(blocks[hot] >= floor)  # (np.nonzero on 2-D is 5x slower)
    ids = hot[at // BLOCK] * BLOCK + at % BLOCK
    tail = logits[n_blocks * BLOCK:]
    if tail.shape[0]:
        ids = np.concatenate((ids, n_blocks * BLOCK + np.flatnonzero(tail >= floor)))
    if not k <= ids.shape[0] <= FAST_CANDIDATES:
        return None
    return ids


def check_grammar(vocab: Any, schema: dict[str, Any]) -> None:
    """Compile and free: what the worker runs (with the job marked) before the engine
    thread compiles the same grammar for real."""
    ll.llama_sampler_free(compile_grammar(vocab, schema))


class Sampler:
    def __init__(self, vocab: Any, n_vocab: int, p: SamplingParams):
        self.n_vocab = n_vocab
        self.chain = self._chain(n_vocab, p)
        self.grammar: Any = None
        self._likely: LikelyFirst | None = None
        self.grammar_since: float | None = None  # applying the grammar since (monotonic)
        # seconds of whole-vocabulary grammar passes since the engine last looked (it makes
        # the job sit out steps for them: llamacpp_seq.py `rest_after_slow`)
        self.slow_s = 0.0
        if p.json_schema is not None:
            try:
                self.grammar = compile_grammar(vocab, p.json_schema)
            except ValueError:
                ll.llama_sampler_free(self.chain)
                raise
            self._cands = (ll.llama_token_data * n_vocab)()
            self._view = np.ctypeslib.as_array(self._cands)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._one = (ll.llama_token_data * 1)()
            self._likely = LikelyFirst.of(n_vocab, p)
        # the fast draw (module docstring): "greedy", "top_k", or None (the chain's own)
        self.fast = self._fast_mode(n_vocab, p)
        self._row_type = ctypes.c_float * n_vocab
        if self.fast == "top_k":
            self.top_k = p.top_k
            self._few = (ll.llama_token_data * FAST_CANDIDATES)()
            self._few_view = np.ctypeslib.as_array(self._few)

    @staticmethod
    def _fast_mode(n_vocab: int, p: SamplingParams) -> str | None:
        if (p.json_schema is not None or p.logit_bias or p.repetition_penalty != 1.0
                or p.frequency_penalty or p.presence_penalty):
            return None
        if p.temperature <= 0.0:
            return "greedy"
        if 0 < p.top_k and n_vocab // BLOCK >= 4 * p.top_k:
            return "top_k"
        return None

    @staticmethod
    def shaping_chain(n_vocab: int, p: SamplingParams) -> Any:
        """The chain's links that change logits by request and history: bias, penalties."""
        if any(t < 0 or t >= n_vocab for t in p.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {n_vocab})")
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if p.logit_bias:
            biases = (ll.llama_logit_bias * len(p.logit_bias))(
                *(ll.llama_logit_bias(tok, bias) for tok, bias in p.logit_bias.items()))
            ll.llama_sampler_chain_add(
                chain, ll.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), biases))
        if (p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty):
            ll.llama_sampler_chain_add(
                chain, ll.llama_sampler_init_penalties(
                    n_vocab, PENALTY_LAST_N, p.repetition_penalty, p.frequency_penalty,
                    p.presence_penalty))
        return chain

    @staticmethod
    def _chain(n_vocab: int, p: SamplingParams) -> Any:
        """llama-server's order: logit bias, penalties, top-k, top-p, min-p, temperature."""
        chain = Sampler.shaping_chain(n_vocab, p)
        if p.temperature <= 0.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
            return chain
        if p.top_k > 0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_temp(p.temperature))
        seed = p.seed if p.seed is not None else random.getrandbits(32)
        ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def replay(self, tokens: list[int]) -> None:
        """A resumed job's state (grammar position, penalty window) must match what the
        first attempt had after the tokens it already streamed."""
        for tok in tokens:
            ll.llama_sampler_accept(self.chain, tok)
            if self.grammar is not None:
                ll.llama_sampler_accept(self.grammar, tok)
            if self._likely is not None:
                self._likely.accept(tok)

    def sample(self, ctx: Any, row: int) -> int:
        # (np.ctypeslib.as_array builds a pointer type per call: a fifth of a fast draw)
        at = (ctypes.cast(ll.llama_get_logits_ith(ctx, row), ctypes.c_void_p).value
              if self.fast is not None else None)
        if at:
            logits = np.frombuffer(memoryview(self._row_type.from_address(at)),
                                   dtype=np.float32)
            tok = int(np.argmax(logits)) if self.fast == "greedy" else self._draw_top_k(logits)
            if tok >= 0:
                ll.llama_sampler_accept(self.chain, tok)
                return tok
        if self.grammar is None:
            return int(ll.llama_sampler_sample(self.chain, ctx, row))
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), shape=(self.n_vocab,))
        self.grammar_since = time.monotonic()  # the worker's heartbeat watches it
        tok = self._pick(logits, with_grammar=False)
        if not self._allowed(tok):  # the slow path: the likeliest candidates, else all
            got = self._likely.pick(self, logits) if self._likely is not None else None
            if got is None:
                t0 = time.perf_counter()
                got = self._pick(logits, with_grammar=True)
                self.slow_s += time.perf_counter() - t0
            tok = got
        ll.llama_sampler_accept(self.grammar, tok)
        self.grammar_since = None
        ll.llama_sampler_accept(self.chain, tok)
        if self._likely is not None:
            self._likely.accept(tok)
        return tok

    def _pick(self, logits: Any, *, with_grammar: bool) -> int:
        v = self._view
        v["id"] = self._ids
        v["logit"] = logits
        v["p"] = 0.0
        arr = ll.llama_token_data_array(data=self._cands, size=self.n_vocab, selected=-1,
                                        sorted=False)
        if with_grammar:
            ll.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        ll.llama_sampler_apply(self.chain, ctypes.byref(arr))
        return int(arr.data[arr.selected].id)

    def _draw_top_k(self, logits: Any) -> int:
        """The chain applied to the candidates that can be in its top-k (-1: too many)."""
        ids = top_k_candidates(logits, self.top_k)
        if ids is None:
            return -1
        n = ids.shape[0]
        v = self._few_view
        v["id"][:n] = ids
        v["logit"][:n] = logits[ids]
        v["p"][:n] = 0.0
        arr = ll.llama_token_data_array(data=self._few, size=n, selected=-1, sorted=False)
        ll.llama_sampler_apply(self.chain, ctypes.byref(arr))
        return int(arr.data[arr.selected].id)

    def _allowed(self, tok: int) -> bool:
        one = self._one[0]
        one.id, one.logit, one.p = tok, 1.0, 0.0  # type: ignore[assignment]
        arr = ll.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        ll.llama_sampler_apply(self.grammar, ctypes.byref(arr))
        return not math.isinf(self._one[0].logit)

    def free(self) -> None:
        ll.llama_sampler_free(self.chain)
        if self.grammar is not None:
            ll.llama_sampler_free(self.grammar)
            self.grammar = None
        if self._likely is not None:
            self._likely.free()
            self._likely = None


class LikelyFirst:
    """A refused token's second draw, constrained over the `LIKELY` likeliest candidates
    instead of the whole vocabulary, when that is provably the same draw.

    The grammar over the whole vocabulary costs 40-80 ms a token with SmolLM2's 49k (more
    with Gemma's 262k), on the engine thread, so every job in the step waits for it; with
    a logit bias on a token the grammar refuses, one tenant's job paid it every step and
    slowed every other job on the worker. Over the likeliest 1,024 it costs ~2% of that.
    Exact, not approximate: a candidate's final logit is at most its logit plus its bias
    (penalties with repetition_penalty >= 1 and frequency/presence >= 0 only lower it), so
    every token outside the subset ends at most `floor` (the highest such bound outside
    it). When the greedy winner, or each of top-k's k, ends above `floor` (its final logit
    computed by the same bias and penalty samplers, fed the same tokens), the whole
    vocabulary yields the same candidates in the same order. Sampling without top-k, or
    with a penalty that can raise a logit, keeps the whole-vocabulary draw."""

    def __init__(self, n_vocab: int, p: SamplingParams):
        self.k = 1 if p.temperature <= 0.0 else p.top_k
        self.bias_ids = np.fromiter(p.logit_bias, dtype=np.int64, count=len(p.logit_bias))
        self.bias = np.fromiter(p.logit_bias.values(), dtype=np.float32,
                                count=len(p.logit_bias))
        self.cands = (ll.llama_token_data * LIKELY)()
        self.view = np.ctypeslib.as_array(self.cands)
        # the chain's bias and penalties alone, fed the same tokens: the subset's final
        # logits (None without penalties: then they are the logits plus the bias)
        self.pre: Any = None
        if p.repetition_penalty != 1.0 or p.frequency_penalty or p.presence_penalty:
            self.pre = Sampler.shaping_chain(n_vocab, p)
            self.scratch = (ll.llama_token_data * LIKELY)()
            self.scratch_view = np.ctypeslib.as_array(self.scratch)

    @classmethod
    def of(cls, n_vocab: int, p: SamplingParams) -> LikelyFirst | None:
        lowering = (p.repetition_penalty >= 1.0 and p.frequency_penalty >= 0.0
                    and p.presence_penalty >= 0.0)
        greedy_or_top_k = p.temperature <= 0.0 or 0 < p.top_k <= LIKELY // 4
        if not lowering or not greedy_or_top_k or n_vocab < 4 * LIKELY:
            return None
        return cls(n_vocab, p)

    def accept(self, tok: int) -> None:
        if self.pre is not None:
            ll.llama_sampler_accept(self.pre, tok)

    def free(self) -> None:
        if self.pre is not None:
            ll.llama_sampler_free(self.pre)
            self.pre = None

    def pick(self, sampler: Sampler, logits: Any) -> int | None:
        """The constrained draw, or None when it is not provably the whole one's."""
        bound = logits
        if self.bias_ids.size:
            bound = logits.copy()
            bound[self.bias_ids] += self.bias
        part = np.argpartition(bound, -(LIKELY + 1))
        floor = bound[part[-(LIKELY + 1)]]
        ids = np.sort(part[-LIKELY:])  # id order, as in the whole row: ties resolve alike
        v = self.view
        v["id"] = ids
        v["logit"] = logits[ids]
        v["p"] = 0.0
        arr = ll.llama_token_data_array(data=self.cands, size=LIKELY, selected=-1,
                                        sorted=False)
        ll.llama_sampler_apply(sampler.grammar, ctypes.byref(arr))
        allowed = np.isfinite(v["logit"])
        if self.pre is None:
            final = bound[ids][allowed]
        else:  # (refused ones stay -inf through bias and penalties)
            self.scratch_view[:] = v
            pre = ll.llama_token_data_array(data=self.scratch, size=LIKELY, selected=-1,
                                            sorted=False)
            ll.llama_sampler_apply(self.pre, ctypes.byref(pre))
            final = self.scratch_view["logit"][allowed]
        if final.size < self.k or np.partition(final, -self.k)[-self.k] <= floor:
            return None
        ll.llama_sampler_apply(sampler.chain, ctypes.byref(arr))
        return int(arr.data[arr.selected].id)


def _sample_rows(ctx: Any, rows: Sequence[tuple[Sampler, int]]) -> list[int]:
    return [sampler.sample(ctx, row) for sampler, row in rows]


class StepSampler:
    """Samples a step's rows; with a second core, the later half of the rows that take
    llama.cpp's full read on a helper thread.

    A full read copies a sequence's whole row of logits (Gemma: 262k) into a candidate
    array: 0.3-0.7 ms a sequence on the 2-core VM, during which the compute threads have
    nothing to do (they sleep after a short spin: the worker sets GOMP_SPINCOUNT). Each
    sequence has its own sampler and reads only its own row, so the two halves run side by
    side (llama.cpp's chain runs in C with the GIL released) and each job draws exactly what
    it would alone. Fast draws (a dozen short numpy calls) stay on the engine's thread:
    split over two threads they spent their time handing the GIL to each other (an 8-stream
    Gemma gap 1.53 ms split, 1.40 ms not).
    """

    def __init__(self, split: bool) -> None:
        self._helper = (ThreadPoolExecutor(1, thread_name_prefix="llama-sample")
                        if split else None)

    def sample(self, ctx: Any, rows: Sequence[tuple[Sampler, int]]) -> list[int]:
        if self._helper is None or len(rows) < 2:
            return _sample_rows(ctx, rows)
        full = [i for i, (sampler, _) in enumerate(rows) if sampler.fast is None]
        if len(full) < 2:
            return _sample_rows(ctx, rows)
        # The first read of a step's logits may reorder llama.cpp's output rows (after a
        # step split into several passes); do it here, before two threads read them.
        ll.llama_get_logits(ctx)
        later_rows = full[(len(full) + 1) // 2:]
        there = set(later_rows)
        later = self._helper.submit(_sample_rows, ctx, [rows[i] for i in later_rows])
        try:
            here = iter(_sample_rows(ctx, [r for i, r in enumerate(rows) if i not in there]))
        finally:
            rest = iter(later.result())  # never leave the helper reading a row past this step
        return [next(rest) if i in there else next(here) for i in range(len(rows))]

    def close(self) -> None:
        if self._helper is not None:
            self._helper.shutdown(wait=True)


def row_logprobs(ctx: Any, vocab: Vocab, row: int, tok: int, k: int) -> dict[str, Any]:
    """The logprobs entry of token `tok` drawn from batch row `row`, with the top `k`."""
    logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, row), shape=(vocab.n_vocab,))
    lp, top = logprobs.from_logits(logits, tok, k)
    # special tokens as their text (`<|im_end|>`, as vLLM shows them), never as "": the
    # generated text itself keeps `piece`, which renders them empty
    return logprobs.entry(vocab.logprob_piece(tok), lp,
                          [(vocab.logprob_piece(t), x) for t, x in top])


def grammar_busy(seqs: Iterable[Any]) -> list[tuple[str, int, float]]:
    """(job, attempt, since) of every sequence whose grammar llama.cpp is applying now: what
    the worker's heartbeat watches for a stalled one (workers/heartbeat.py)."""
    return [(s.req.job_id, s.req.attempt, t) for s in seqs
            if (t := s.sampler.grammar_since) is not None]
