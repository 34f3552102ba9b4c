"""The llama.cpp context and batch the engine loop runs on (workers/engines/llamacpp.py).

One context with n_seq_max = slots and a KV stream per sequence (each gets n_ctx / slots
cells, as in llama-server); compute threads as configured (every core by default); flash
attention as llama-server's `auto` unless the model entry says otherwise; and a way to
stop a step under way (StepAbort).
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import llama_cpp as ll

from tokenq.shared.settings import ModelConfig


def threads_of(cfg: ModelConfig) -> int:
    """Compute threads: as configured, else one per core."""
    return cfg.n_threads or os.cpu_count() or 1


def create_context(model: Any, cfg: ModelConfig, slots: int) -> Any:
    params = ll.llama_context_default_params()
    params.n_ctx = cfg.n_ctx
    params.n_batch = cfg.n_batch
    params.n_ubatch = cfg.n_ubatch
    params.n_seq_max = slots
    params.kv_unified = cfg.kv_unified
    threads = threads_of(cfg)
    params.n_threads = threads
    params.n_threads_batch = threads
    params.flash_attn_type = (ll.LLAMA_FLASH_ATTN_TYPE_AUTO if cfg.flash_attn is None
                              else int(cfg.flash_attn))
    ctx = ll.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    return ctx


class StepAbort:
    """Stops the llama_decode under way, from any thread, between two of its graph nodes.

    llama.cpp's compute asks an abort callback after every node (~800 a step); a Python
    callback would take the GIL each time, so the callback is libc's strlen on a two-byte
    flag: C only, 0 (run on) or 1 (stop). An aborted llama_decode returns 2 and drops the
    KV cells of the ubatch it stopped in; the engine drops the rest of the step's and plans
    the next step afresh (workers/engines/llamacpp.py). Only a step the engine marks
    stoppable is stopped, and for what: a preemption's hold stops any step but one that
    carries a prompt someone waits for (a second interactive arrival must not throw away
    the first one's prefill); an interactive job that finds a free slot stops only a step
    of batch rows alone (it would otherwise wait for work nobody watches)."""

    def __init__(self, ctx: Any) -> None:
        self._flag = ctypes.create_string_buffer(2)
        strlen = ctypes.cast(ctypes.CDLL(None).strlen, ctypes.c_void_p).value
        if strlen is None:
            raise RuntimeError("libc's strlen was not found")
        self._callback = ll.ggml_abort_callback(strlen)  # kept: llama.cpp holds a pointer
        ll.llama_set_abort_callback(ctx, self._callback,
                                    ctypes.cast(self._flag, ctypes.c_void_p))
        self._lock = threading.Lock()
        self._for_hold = self._for_arrival = False

    def running(self, *, for_hold: bool, for_arrival: bool) -> None:
        """The engine thread, right before llama_decode: may a hold, may an interactive
        arrival, request() to stop this step?"""
        with self._lock:
            self._for_hold, self._for_arrival = for_hold, for_arrival

    def done(self) -> None:
        """The engine thread, once llama_decode returned: nothing runs to be stopped."""
        with self._lock:
            self._for_hold = self._for_arrival = False
            self._flag[0] = b"\0"

    def request(self, *, arrival: bool = False) -> None:
        """Stop the step under way, if it may be stopped for a hold (or for an arrival)."""
        with self._lock:
            if self._for_arrival if arrival else self._for_hold:
                self._flag[0] = b"x"


def fill(batch: Any, n: int, tokens: list[int], pos0: int, seq_id: int) -> int:
    """Put one sequence's `tokens` into `batch` from row `n` (no logits); the next row."""
    for i, tok in enumerate(tokens):
        batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, pos0 + i, 1
        batch.seq_id[n][0], batch.logits[n] = seq_id, 0
        n += 1
    return n
