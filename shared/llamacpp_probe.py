"""The child process that tries one llama.cpp CPU variant (llamacpp_dispatch.py).

    python -m <this module> VARIANT.so MODEL.gguf

Loads the variant into llama.cpp, loads the model's weights (in the variant's own buffer
types: the AMX variant repacks them for its tile kernels), and decodes a 32-token prompt
and one token more: the batched and the single-row matmuls a worker's steps run. Exit 0
and the logits finite: the variant runs here. A variant whose instructions the CPU refuses
dies on its first matmul (SIGILL, exit -4 seen by the parent); the worker never does.
"""

from __future__ import annotations

import ctypes
import math
import sys
from pathlib import Path


def run(variant: Path, model_path: Path) -> None:
    import llama_cpp as ll

    from .llamacpp_dispatch import load_variant

    ll.llama_backend_init()
    load_variant(Path(ll.__file__).parent / "lib", variant)
    params = ll.llama_model_default_params()
    params.n_gpu_layers = 0
    model = ll.llama_model_load_from_file(str(model_path).encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    cparams = ll.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 128, 64, 64
    cparams.n_threads = cparams.n_threads_batch = 1
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    prompt = [(7 + 31 * i) % n_vocab for i in range(32)]
    for pos0, tokens in ((0, prompt), (len(prompt), prompt[:1])):
        batch = ll.llama_batch_init(len(tokens), 0, 1)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos0 + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, int(i == len(tokens) - 1)
        batch.n_tokens = len(tokens)
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        logits = ll.llama_get_logits_ith(ctx, len(tokens) - 1)
        row = ctypes.cast(logits, ctypes.POINTER(ctypes.c_float))
        if not all(math.isfinite(row[i]) for i in range(min(n_vocab, 256))):
            raise SystemExit("the logits are not finite")
        ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    ll.llama_model_free(model)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    run(Path(sys.argv[1]), Path(sys.argv[2]))
