"""Raw llama.cpp cost on this machine: prefill rate and decode step time vs batch size.

The ceiling any engine loop (tokenq's, llama-server's) works under: one llama_decode
per step, no sampling, no I/O.  Usage:
    .venv/bin/python benchmarks/decode_scaling.py [model] [--unified] [--fa] [--mixed]

--mixed: the cost of a step carrying 7 decode tokens plus a prompt chunk of P tokens,
P = 0..128 (the shapes the engine's prefill budget chooses between), shapes taken in
turn so that neighbour load on the machine hits them all alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import llama_cpp as ll

from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.llamacpp import Vocab


def main() -> None:
    name = next((a for a in sys.argv[1:] if not a.startswith("--")), "smollm2-135m-instruct")
    settings = Settings()
    cfg = settings.models()[name]
    vocab = Vocab(gguf_path(cfg, settings.state_dir), cfg, vocab_only=False)
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 16384, 1024, 512, 8
    params.kv_unified = "--unified" in sys.argv
    params.flash_attn_type = 1 if "--fa" in sys.argv else 0
    params.n_threads = params.n_threads_batch = 2
    ctx = ll.llama_init_from_model(vocab.model, params)
    mem = ll.llama_get_memory(ctx)
    batch = ll.llama_batch_init(1024, 0, 1)
    prompt = vocab.tokenize("The customer called about the invoice again. " * 10)[:80]

    def decode(items: list[tuple[int, list[int], int]]) -> float:
        n = 0
        for seq, toks, pos0 in items:
            for i, tok in enumerate(toks):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = tok, pos0 + i, 1
                batch.seq_id[n][0], batch.logits[n] = seq, int(i == len(toks) - 1)
                n += 1
        batch.n_tokens = n
        t0 = time.perf_counter()
        assert ll.llama_decode(ctx, batch) == 0
        return time.perf_counter() - t0

    # The first llama_decode of a context is cold (graph allocation, weights paged in from
    # the mmapped file): warm up, then take the median of several prefills.
    decode([(0, prompt, 0)])
    prefills = []
    for _ in range(5):
        ll.llama_memory_clear(mem, True)
        prefills.append(decode([(0, prompt, 0)]))
    dt = sorted(prefills)[2]
    print(f"{name} kv_unified={params.kv_unified} fa={'--fa' in sys.argv}: prefill "
          f"{len(prompt)} tokens {dt * 1000:.0f} ms = {len(prompt) / dt:.0f} tok/s")
    for nseq in (1, 4, 8):
        ll.llama_memory_clear(mem, True)
        decode([(s, prompt, 0) for s in range(nseq)])
        steps = sorted(decode([(s, [prompt[k]], len(prompt) + k) for s in range(nseq)])
                       for k in range(10))
        print(f"  decode {nseq} seqs: {steps[5] * 1000:.1f} ms/step = "
              f"{nseq / steps[5]:.0f} tok/s")
    if "--mixed" in sys.argv:
        mixed(decode, mem, prompt)
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)


def mixed(decode: Callable[[list[tuple[int, list[int], int]]], float], mem: Any,
          prompt: list[int]) -> None:
    """7 sequences decode at position ~80; sequence 7 is prefilled P tokens at a time."""
    ll.llama_memory_clear(mem, True)
    decode([(s, prompt, 0) for s in range(7)])
    chunks = (0, 4, 8, 16, 32, 64, 128)
    times: dict[int, list[float]] = {p: [] for p in chunks}
    long_prompt = (prompt * 4)[:128]
    for k in range(6):
        for p in chunks:
            ll.llama_memory_seq_rm(mem, 7, -1, -1)
            for s in range(7):  # keep the decoders at the same position every round
                ll.llama_memory_seq_rm(mem, s, len(prompt), -1)
            items = [(s, [prompt[k]], len(prompt)) for s in range(7)]
            if p:
                items.append((7, long_prompt[:p], 0))
            times[p].append(decode(items))
    base = sorted(times[0])[3]
    for p in chunks:
        t = sorted(times[p])[3]
        extra = (t - base) / p * 1000 if p else 0.0
        print(f"  7 decode + {p:3d} prompt tokens: {t * 1000:6.1f} ms/step "
              f"({t / base:4.2f}x a decode-only step; {extra:4.1f} ms per prompt token)")


if __name__ == "__main__":
    main()
