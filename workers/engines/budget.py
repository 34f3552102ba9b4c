"""How many prompt tokens one llama.cpp step may carry beside the decoding streams.

Each step that carries prompt tokens delays every decoding stream's next token, so
while streams decode a long prompt is prefilled in chunks (chunked prefill). The
chunk is found by feedback on the engine's own step times, measured online (they
move with the model, the context lengths and the machine's load): after a step with
P prompt tokens that took r times a decode-only step with as many streams, the
next chunk aims at P * (itl_ratio - 1) / (r - 1). No cost model is assumed: on
llama.cpp with per-sequence KV a prompt chunk costs a pass of its own (a fixed
cost) plus a per-token cost that falls with the chunk's size, and the feedback
settles on the largest chunk that keeps steps within `itl_ratio` (or on
`min_chunk` when even that costs more).

Who waits matters too. While at least as many jobs wait for their first token as
are decoding (a burst of arrivals, or nothing decoding at all), a step takes
whole prompts up to `n_batch`: many users' time to first token outweighs a few
streams' smoothness, and big batches are the cheapest way through prompts. But not past
`burst_s` seconds a step while a stream someone watches decodes (from the measured cost
of a prompt token): counted in jobs, one tenant's single long prompt beside another's
single stream was such a burst, and a 1,900-token prompt stood that stream still for its
whole prefill (29 s on a loaded 2-core VM). On a CPU a prompt token costs about the same
however many share a step, so steps of `burst_s` cost the burst's prompts little more
than one pass per step. The same bound holds for short prompts that go in whole (beyond
the first of them). Batch
(background) jobs do not count as waiting: nobody watches their first token, and a
step must not grow long on their prompts beside streams someone watches. Their prompts
go in bounded chunks there, and not at all while another job's prompt is in; with the
batch alone on the engine they fill the step, as llama-server's prompts do (an
interactive arrival stops such a step: llamacpp_context.StepAbort).

Nor do batch jobs' decoding rows ride in the step that prefills someone's whole prompt:
they sit that step out (never two steps running), so the first token waits for the
prompt alone. On a CPU a step's cost is about the sum of its rows' (prefill is bound by
compute, not by reading the weights), so a prompt step plus a decode step cost the batch
what the two in one step would: measured beside 7 batch streams, the step that carried an
interactive prompt took ~135-150 ms against ~95-100 ms for the prompt alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.5  # how far the chunk moves towards each new estimate
# A burst step beside a watched stream before a prompt token's cost is measured (about a
# second on a slow 2-core VM); a prompt token's cost is measured only on steps with at
# least PER_TOKEN_MIN of them, where a pass's own cost does not dominate.
UNMEASURED_BURST, PER_TOKEN_MIN = 128, 32
STALL = 10.0  # a step this many times slower than expected is a stall (frozen VM), not data


@dataclass(frozen=True, slots=True)
class Want:
    """One sequence's input as the step planner sees it."""

    tokens: int  # input tokens left (1 for a decoding sequence)
    prefilling: bool
    whole: bool = False  # a prompt that may go in whole (an interactive or a short one)
    background: bool = False  # a batch job's prompt: bounded chunks only


class PrefillBudget:
    def __init__(self, slots: int, n_batch: int, itl_ratio: float, min_chunk: int,
                 background_tokens: int = 0, burst_s: float | None = 0.5):
        self.n_batch = n_batch
        self.burst_s = burst_s
        self._per_token: float | None = None  # a prompt token's cost in a step, measured
        # Batch prompt tokens one step may carry at most (beyond the learned chunk).
        self.background_tokens = background_tokens
        self.itl_ratio = itl_ratio
        self.min_chunk = min_chunk
        self.chunk = float(min_chunk)
        self._benched = False  # the last step left the batch jobs' decoding rows out
        self._t_decode: list[float | None] = [None] * (slots + 1)  # by decoding streams

    def tokens(self, decoding: int, prefilling: int, watched: bool = True) -> int:
        """Prompt tokens the next step may carry beside `decoding` decoding streams while
        `prefilling` jobs wait for their first token (`watched`: some of the streams are
        not batch jobs')."""
        room = max(0, self.n_batch - decoding)
        if prefilling and prefilling >= decoding:
            return min(room, self.burst_tokens(decoding, watched))
        return min(room, self.chunk_tokens())

    def burst_tokens(self, decoding: int, watched: bool = True) -> int:
        """Prompt tokens that keep a step beside `decoding` streams within `burst_s`
        (UNMEASURED_BURST while the costs are not measured yet); with none of them watched
        (`watched`: some are not batch jobs'), or without `burst_s`, the whole batch."""
        if decoding == 0 or not watched or self.burst_s is None:
            return self.n_batch
        td = self.decode_time(decoding)
        if td is None or self._per_token is None:
            return max(self.chunk_tokens(), UNMEASURED_BURST)
        return max(self.chunk_tokens(), int((self.burst_s - td) / self._per_token))

    def chunk_tokens(self) -> int:
        """A prompt chunk that keeps a step within `itl_ratio` of a decode-only one."""
        return max(self.min_chunk, int(self.chunk))

    def split(self, wants: Sequence[Want]) -> list[int]:
        """Tokens each of `wants` puts into the next step. `wants` in step order: the
        decoding sequences, then whole prompts, then the rest oldest first."""
        # A whole prompt someone waits for goes in without the batch's decoders, though
        # never two steps running (a stream of arrivals cannot stall the batch).
        bench = not self._benched and any(w.prefilling and w.whole and not w.background
                                          for w in wants)
        benched = [bench and w.background and not w.prefilling for w in wants]
        self._benched = any(benched)
        decoding = sum(1 for w in wants if not w.prefilling)
        waiting = sum(1 for w in wants if w.prefilling and not w.background)
        wholes = [w.tokens for w in wants if w.prefilling and w.whole]
        room = max(0, self.n_batch - decoding)
        # Beside streams someone watches, whole prompts beyond the first within burst_s.
        streams = any(not w.prefilling and not w.background for w in wants)
        cap = max(self.burst_tokens(decoding, streams), wholes[0] if wholes else 0)
        prompts = max(min(sum(wholes), room, cap), self.tokens(decoding, waiting, streams))
        # Batch prompts: none while another prompt is being prefilled (an interactive
        # one's first token comes first); a bounded chunk beside streams someone watches;
        # with the batch alone on the engine, as many as the step holds (as llama-server
        # takes prompts): such a step is one an interactive arrival stops (StepAbort).
        watched = any(not w.background for w in wants)
        background = (0 if waiting else max(self.chunk_tokens(), self.background_tokens)
                      if watched else room)
        if any(w.prefilling and w.background for w in wants):
            prompts = max(prompts, min(background, room))
        left = decoding - sum(benched) + prompts
        takes: list[int] = []
        for w, b in zip(wants, benched, strict=True):
            take = 0 if b else min(w.tokens, left)
            if w.prefilling and w.background:
                take = min(take, background)
                background -= take
            takes.append(take)
            left -= take
        return takes

    def decode_time(self, decoding: int) -> float | None:
        """A decode-only step's time with `decoding` streams: measured, else scaled
        from the nearest count measured."""
        decoding = min(decoding, len(self._t_decode) - 1)
        t = self._t_decode[decoding]
        if t is not None:
            return t
        known = [(k, v) for k, v in enumerate(self._t_decode) if v is not None]
        if not known:
            return None
        k, v = min(known, key=lambda kv: abs(kv[0] - decoding))
        return v * decoding / k

    def observe(self, decoding: int, prompt_tokens: int, seconds: float) -> None:
        """One step's llama_decode time."""
        if decoding == 0 or seconds <= 0:
            return
        td = self.decode_time(decoding)
        if td is not None and prompt_tokens >= PER_TOKEN_MIN and seconds > td:
            # before the stall check below: a burst step is many decode steps long
            per, old = (seconds - td) / prompt_tokens, self._per_token
            if old is None:
                self._per_token = per
            elif per < STALL * old:  # (a frozen VM, not the engine)
                self._per_token = old + ALPHA * (per - old)
        if td is not None and seconds > STALL * td * (self.itl_ratio if prompt_tokens else 1):
            return
        if prompt_tokens == 0:
            d = min(decoding, len(self._t_decode) - 1)
            old = self._t_decode[d]
            self._t_decode[d] = seconds if old is None else old + 0.3 * (seconds - old)
            return
        if td is None or prompt_tokens < self.chunk / 2:
            return  # a prompt's short tail says little about what a full chunk costs
        excess = max(seconds / td - 1.0, 0.02)
        want = prompt_tokens * (self.itl_ratio - 1.0) / excess
        want = min(want, 1.25 * self.chunk)  # grow gently: an overshoot is a slow step
        self.chunk = max(float(self.min_chunk),
                         min(float(self.n_batch), self.chunk + ALPHA * (want - self.chunk)))
