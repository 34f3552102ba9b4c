"""LoRA adapters for the llama.cpp engine: loaded versions, who uses them, which is applied.

llama.cpp applies adapters to a whole context (`llama_set_adapters_lora`), not to a
sequence, and one context holds every job's KV. So the engine runs each step for one
adapter group only: the jobs sharing an adapter version (or none) decode together, and
groups take turns step by step (`pick_group`). A sequence's KV cells are written only
in its own group's steps, so each job's KV is computed with its own adapter throughout;
the cost is that with G groups in flight each gets 1/G of the steps. The prefix cache
keys a free slot's cells by the adapter version they were computed with and never
reuses them for another (llamacpp_slots.py `SlotPool.take`).

All llama.cpp calls here run on the engine thread (the model's adapter list and the
context's graph are not thread-safe); other threads go through the engine's inbox.
Version ids come from the registry (unique across names), 0 is "no adapter".
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterable
from typing import Any

import llama_cpp as ll

from tokenq.shared.lora_registry import AdapterRef

log = logging.getLogger(__name__)

BASE = 0


class LoraSet:
    """Adapter versions loaded into one model; freed once neither wanted nor in use."""

    def __init__(self, model: Any, ctx: Any):
        self.model = model
        self.ctx = ctx
        self._loaded: dict[int, Any] = {}  # version id -> llama_adapter_lora pointer
        self._users: dict[int, int] = {}  # version id -> jobs in flight using it
        self._wanted: set[int] = set()  # versions the registry currently serves
        self._applied = BASE
        self.last_load_s = 0.0

    def load(self, ref: AdapterRef) -> None:
        if ref.id in self._loaded:
            return
        t0 = time.perf_counter()
        ptr = ll.llama_adapter_lora_init(self.model, ref.path.encode())
        if not ptr:
            raise RuntimeError(f"llama.cpp could not load a LoRA adapter from {ref.path} "
                               "(a GGUF LoRA made for this base model is needed)")
        self._loaded[ref.id] = ptr
        self.last_load_s = time.perf_counter() - t0
        log.info("LoRA %s@%d loaded from %s in %.3f s", ref.name, ref.id, ref.path,
                 self.last_load_s)

    def want(self, ref: AdapterRef) -> None:
        self.load(ref)
        self._wanted.add(ref.id)

    def unwant(self, vid: int) -> None:
        self._wanted.discard(vid)
        self._maybe_free(vid)

    def acquire(self, ref: AdapterRef | None) -> int:
        """A job starts: load its version if needed (a version rolled away from after the
        job was submitted); returns the group id."""
        if ref is None:
            return BASE
        self.load(ref)
        self._users[ref.id] = self._users.get(ref.id, 0) + 1
        return ref.id

    def release(self, vid: int) -> None:
        if vid == BASE:
            return
        self._users[vid] -= 1
        self._maybe_free(vid)

    def _maybe_free(self, vid: int) -> None:
        if vid in self._wanted or self._users.get(vid, 0) > 0 or vid not in self._loaded:
            return
        if self._applied == vid:
            self.apply(BASE)
        ll.llama_adapter_lora_free(self._loaded.pop(vid))
        self._users.pop(vid, None)
        log.info("LoRA version %d freed", vid)

    def apply(self, vid: int) -> None:
        """Make `vid` the context's adapter for the next decode (a no-op if it is)."""
        if vid == self._applied:
            return
        if vid == BASE:
            rc = ll.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            arr = (ll.llama_adapter_lora_p_ctypes * 1)(self._loaded[vid])
            scales = (ctypes.c_float * 1)(1.0)
            rc = ll.llama_set_adapters_lora(self.ctx, arr, 1, scales)
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora returned {rc}")
        self._applied = vid

    def loaded(self) -> list[int]:
        return sorted(self._loaded)

    def close(self) -> None:
        if self._loaded and self.ctx:
            ll.llama_set_adapters_lora(self.ctx, None, 0, None)
        for ptr in self._loaded.values():
            ll.llama_adapter_lora_free(ptr)
        self._loaded.clear()


def pick_group(groups: Iterable[int], last: int | None) -> int:
    """Round robin over the adapter groups with jobs in flight: the next id after `last`."""
    ids = sorted(set(groups))
    if last is None:
        return ids[0]
    return next((g for g in ids if g > last), ids[0])
