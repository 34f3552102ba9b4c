"""The llama.cpp context and batch the engine loop runs on (workers/engines/llamacpp.py).

One context with n_seq_max = slots and a KV stream per sequence (each gets n_ctx / slots
cells, as in llama-server); compute threads as configured (every core by default); flash
attention as llama-server's `auto` unless the model entry says otherwise.
"""

from __future__ import annotations

import os
from typing import Any

import llama_cpp as ll

from shared.settings import ModelConfig


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


def fill(batch: Any, n: int, tokens: list[int], pos0: int, seq_id: int) -> int:
    """Put one sequence's `tokens` into `batch` from row `n` (no logits); the next row."""
    for i, tok in enumerate(tokens):
        batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, pos0 + i, 1
        batch.seq_id[n][0], batch.logits[n] = seq_id, 0
        n += 1
    return n
