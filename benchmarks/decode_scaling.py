"""Raw llama.cpp cost on this machine: prefill rate and decode step time vs batch size.

The ceiling any engine loop (tokenq's, llama-server's) works under: one llama_decode
per step, no sampling, no I/O.  Usage:
    .venv/bin/python benchmarks/decode_scaling.py [model] [--unified]
"""

from __future__ import annotations

import sys
import time

import llama_cpp as ll

from shared.models import gguf_path
from shared.settings import Settings
from workers.engines.llamacpp import Vocab


def main() -> None:
    name = next((a for a in sys.argv[1:] if not a.startswith("--")), "smollm2-135m-instruct")
    settings = Settings()
    cfg = settings.models()[name]
    vocab = Vocab(gguf_path(cfg, settings.state_dir), cfg, vocab_only=False)
    params = ll.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 16384, 1024, 512, 8
    params.kv_unified = "--unified" in sys.argv
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

    dt = decode([(0, prompt, 0)])
    print(f"{name} kv_unified={params.kv_unified}: prefill {len(prompt)} tokens "
          f"{dt * 1000:.0f} ms = {len(prompt) / dt:.0f} tok/s")
    for nseq in (1, 4, 8):
        ll.llama_memory_clear(mem, True)
        decode([(s, prompt, 0) for s in range(nseq)])
        steps = sorted(decode([(s, [prompt[k]], len(prompt) + k) for s in range(nseq)])
                       for k in range(10))
        print(f"  decode {nseq} seqs: {steps[5] * 1000:.1f} ms/step = "
              f"{nseq / steps[5]:.0f} tok/s")
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)


if __name__ == "__main__":
    main()
