"""The llama.cpp engine's slots: one sequence id per running job, and the prompt cache.

Part of the llama.cpp engine (llamacpp.py). A finished job's slot keeps its KV cells; a
new job takes the lowest free slot, and keeps the prefix of its input that slot's cells
already hold (llama-server's prompt cache: a post-call template or a long system prompt
is prefilled once per slot, not once per job). It takes another free slot only for a
much longer prefix there: running jobs packed on the low ids keep each engine step one
llama.cpp pass (SlotPool.take). Only cells computed with the same adapter version count:
another adapter's KV is different KV. Cells a new job would overwrite are first copied to
host memory (llamacpp_ramcache.py), and come back into whatever slot a later job with
that prefix takes: a preempted batch job resumes without prefilling again.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import llama_cpp as ll

from tokenq.shared.vocab import Vocab
from tokenq.workers.engines.llamacpp_context import fill
from tokenq.workers.engines.llamacpp_lora import BASE
from tokenq.workers.engines.llamacpp_ramcache import MIN_TOKENS, RamCache

# A cached prefix must save this many more prompt tokens than the lowest free slot's to
# take a slot off the low ids (SlotPool.take).
SPREAD_MIN_TOKENS = 64
# A user message no template writes anything like (warm_slots cuts the prompt there).
WARM_MARK = "\x00tokenq-user\x00"

log = logging.getLogger(__name__)


class SlotPool:
    """The context's sequence ids (n_seq_max of them): which are free, and the tokens whose
    KV each free one still holds."""

    def __init__(self, mem: Any, slots: int, prefix_cache: bool,
                 ram: RamCache | None = None) -> None:
        self.mem = mem
        self.prefix_cache = prefix_cache
        self.ram = ram if prefix_cache else None
        self.free = list(range(slots))
        # (adapter version, tokens) whose KV a free slot still holds
        self._cached: dict[int, tuple[int, list[int]]] = {}

    def take(self, tokens: list[int], group: int, fresh: bool = False) -> tuple[int, int]:
        """The slot for a job whose input is `tokens` (KV of adapter version `group`), and
        how many of its cached cells are kept: the longest shared prefix, less at least
        one token so that the job decodes one for fresh logits. `fresh` (the request's
        cache_prompt false): no cached cell is kept.

        The lowest free slot, unless another one's cached prefix saves SPREAD_MIN_TOKENS
        more of the prompt: llama.cpp packs a step into one pass only over slots whose ids
        run consecutively, so running jobs kept on the low ids make fewer, bigger passes
        (a gap costs the whole batch an extra pass every step, while a few prompt tokens
        are one step's work once)."""
        best = min(self.free)
        best_len = self._shared(best, tokens, group) if self.prefix_cache and not fresh else 0
        if self.prefix_cache and not fresh:
            for sid in sorted(self.free):
                n = self._shared(sid, tokens, group)
                if n >= best_len + SPREAD_MIN_TOKENS:
                    best, best_len = sid, n
        self.free.remove(best)
        key, ram_len = (None, 0) if self.ram is None or fresh else self.ram.best(tokens, group)
        from_ram = key is not None and ram_len >= best_len + MIN_TOKENS
        cached_group, cached = self._cached.pop(best, (BASE, []))
        if self.ram is not None and len(cached) - (0 if from_ram else best_len) >= MIN_TOKENS:
            self.ram.save(best, cached_group, cached)  # cells about to be overwritten
        if from_ram and self.ram is not None and key is not None:
            ll.llama_memory_seq_rm(self.mem, best, -1, -1)
            best_len = ram_len if self.ram.restore(key, best) else 0
            log.debug("slot %d: %d cached tokens back from host memory", best, best_len)
        keep = min(best_len, len(tokens) - 1)
        if keep <= 0 or not ll.llama_memory_seq_rm(self.mem, best, keep, -1):
            ll.llama_memory_seq_rm(self.mem, best, -1, -1)
            keep = 0
        return best, keep

    def _shared(self, sid: int, tokens: list[int], group: int) -> int:
        """How many leading tokens of `tokens` the free slot `sid` holds the KV of."""
        cached_group, cached = self._cached.get(sid, (BASE, []))
        if cached_group != group:
            return 0
        n = 0
        for a, b in zip(cached, tokens, strict=False):
            if a != b:
                break
            n += 1
        return n

    def seed(self, seq_id: int, group: int, cached: list[int]) -> None:
        """The free slot `seq_id` holds the KV of `cached` (warm_slots)."""
        self._cached[seq_id] = (group, cached)

    def give_back(self, seq_id: int, group: int, cached: list[int] | None) -> None:
        """Free a slot. `cached`: the tokens at positions [0, len) its cells hold, kept for
        the next job with that prefix; None drops its KV (after a failed decode it may be
        inconsistent)."""
        if cached is None:
            ll.llama_memory_seq_rm(self.mem, seq_id, -1, -1)
        else:
            self._cached[seq_id] = (group, cached)
        self.free.append(seq_id)


def template_head(vocab: Vocab) -> list[int]:
    """The tokens every chat prompt of this vocabulary starts with, whatever the user
    writes (the template's opening: SmolLM2's default system prompt, 24 tokens); [] for a
    model without a chat template."""
    try:
        text = vocab.render(None, [{"role": "user", "content": WARM_MARK}])
    except ValueError:
        return []
    full, head = vocab.tokenize(text), vocab.tokenize(text.split(WARM_MARK)[0])
    same = itertools.takewhile(lambda ab: ab[0] == ab[1], zip(full, head, strict=False))
    return [a for a, _ in same]


def warm_slots(vocab: Vocab, ctx: Any, batch: Any, rows: int, pool: SlotPool) -> int:
    """Prefill the template's opening into every free slot in one decode and record it as
    their cached prefix, as a slot keeps its last job's prompt: the first burst of chat
    requests after a worker starts keeps that much of each prompt instead of prefilling it
    (a cold worker's first round: docs/benchmarks.md). The tokens per slot, 0 for none."""
    slots = sorted(pool.free)
    tokens = template_head(vocab)[:rows // max(len(slots), 1)]
    if len(tokens) < 2 or not slots:
        return 0
    n = 0
    for sid in slots:
        n = fill(batch, n, tokens, 0, sid)
    batch.logits[n - 1] = 1
    batch.n_tokens = n
    if ll.llama_decode(ctx, batch) != 0:
        for sid in slots:
            ll.llama_memory_seq_rm(pool.mem, sid, -1, -1)
        return 0
    for sid in slots:
        pool.seed(sid, BASE, tokens)
    return len(tokens)
