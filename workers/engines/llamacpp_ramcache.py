"""The llama.cpp engine's prompt cache in host memory (llama-server's `--cache-ram`).

Part of the llama.cpp engine (llamacpp.py, through llamacpp_slots.py). A free slot keeps
the KV cells of its last job for the next job with the same prefix, but only until a job
with other tokens takes that slot. Before that slot is reused, its cells are copied here
(llama_state_seq_get_data: a memcpy, ~4 ms for 280 SmolLM2 tokens here), and a later job
whose input starts with those tokens gets them copied back into whatever slot it takes
(llama_state_seq_set_data, ~1 ms) instead of prefilling them again (~2 s on a 2-core VM).

The job this matters most for is a preempted batch job (workers/preempt.py): the
interactive job it made way for takes its slot, and when it comes back its input is its
prompt plus every token it streamed, which are exactly the tokens saved here. A restore is
exact: the same cells, not a recomputation (a greedy continuation does not move).

Bounded: entries of at least `MIN_TOKENS` tokens, least recently used out first past
`budget_bytes`. Only cells of the same adapter version are reused (another adapter's KV
is different KV), and only a job's exact token prefix, as with the slots' own cache.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll
import numpy as np

# Fewer cached tokens than this are not worth an entry: prefilling them is cheap.
MIN_TOKENS = 64
MAX_ENTRIES = 1024


@dataclass(slots=True)
class Entry:
    group: int  # adapter version the cells were computed with
    tokens: np.ndarray[Any, np.dtype[np.int32]]  # the tokens at positions [0, len)
    state: Any  # ctypes byte array from llama_state_seq_get_data


class RamCache:
    def __init__(self, ctx: Any, budget_bytes: int) -> None:
        self.ctx = ctx
        self.budget_bytes = budget_bytes
        self.used_bytes = 0
        self._entries: dict[int, Entry] = {}  # oldest first
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, seq_id: int, group: int, tokens: list[int]) -> bool:
        """Copy sequence `seq_id`'s cells, which hold `tokens`, before its slot is reused.
        Nothing is saved that is too short, too big for the budget, or already held."""
        if len(tokens) < MIN_TOKENS or self.budget_bytes <= 0:
            return False
        arr = np.asarray(tokens, dtype=np.int32)
        extended = []  # entries that are a prefix of these tokens: this one replaces them
        for key, e in self._entries.items():
            if e.group == group:
                n = _shared(e.tokens, arr)
                if n >= len(arr):
                    return False  # an entry holds these tokens (or more) already
                if n >= len(e.tokens):
                    extended.append(key)
        size = int(ll.llama_state_seq_get_size(self.ctx, seq_id))
        if size <= 0 or size > self.budget_bytes:
            return False
        state = (ctypes.c_uint8 * size)()
        if int(ll.llama_state_seq_get_data(self.ctx, state, size, seq_id)) != size:
            return False
        for key in extended:
            self._drop(key)
        while self._entries and (self.used_bytes + size > self.budget_bytes
                                 or len(self._entries) >= MAX_ENTRIES):
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = Entry(group, arr, state)
        self._next += 1
        self.used_bytes += size
        return True

    def best(self, tokens: list[int], group: int) -> tuple[int | None, int]:
        """The entry sharing the longest prefix with `tokens` (same adapter version), and
        how many tokens it shares."""
        arr = np.asarray(tokens, dtype=np.int32)
        found, found_len = None, 0
        for key, e in self._entries.items():
            if e.group == group:
                n = _shared(e.tokens, arr)
                if n > found_len:
                    found, found_len = key, n
        return found, found_len

    def restore(self, key: int, seq_id: int) -> bool:
        """Copy entry `key`'s cells into the (emptied) sequence `seq_id`; the entry leaves
        the cache (the slot holds it now, and saves it again when it is reused)."""
        e = self._entries[key]
        ok = int(ll.llama_state_seq_set_data(self.ctx, e.state, len(e.state), seq_id)) > 0
        self._drop(key)
        return ok

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self.used_bytes -= len(e.state)


def _shared(a: np.ndarray[Any, np.dtype[np.int32]],
            b: np.ndarray[Any, np.dtype[np.int32]]) -> int:
    """The length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
