"""The JSON-schema grammar llama.cpp workers compile: llama-server's string rule over
llama-cpp-python's converter (workers/engines/json_grammar.py)."""

from __future__ import annotations

import re

from tokenq.cli.transcripts import SUMMARY_SCHEMA
from tokenq.workers.engines.json_grammar import CHAR_RULE, schema_gbnf


def rules(gbnf: str) -> dict[str, str]:
    return {line.split("::=", 1)[0].strip(): line.split("::=", 1)[1].strip()
            for line in gbnf.splitlines() if "::=" in line}


def test_strings_admit_no_control_character_and_whitespace_stays_compact() -> None:
    got = rules(schema_gbnf(SUMMARY_SCHEMA))
    assert f"char ::= {got['char']}" == CHAR_RULE
    assert r"\x00-\x1F" in got["char"] and r"\x7F" in got["char"]
    assert got["space"] == '" "?'
    # the rest of the converter's grammar is kept: every property, the enum, the bounds
    assert set(got) >= {"root", "issue", "actions", "actions-item", "sentiment"}
    assert got["issue"].count("char") == 160


def test_the_grammar_compiles_in_llama_cpp() -> None:
    import llama_cpp as ll

    from tokenq.shared.settings import get_settings
    from tokenq.shared.vocab import Vocab
    from tokenq.shared.weights import gguf_path
    from tokenq.workers.engines.llamacpp_sampling import compile_grammar

    s = get_settings()
    cfg = s.models()[s.default_model]
    vocab = Vocab(gguf_path(cfg, s.state_dir), cfg, vocab_only=True)
    try:
        for schema in (SUMMARY_SCHEMA, {"type": "object", "properties": {
                "a": {"type": "string", "pattern": "^[a-z]+$"}}}, {"type": "array"}):
            ll.llama_sampler_free(compile_grammar(vocab.vocab, schema))
        assert re.search(r"space ::= ", schema_gbnf({"type": "array"}))
    finally:
        vocab.close()


def test_a_raw_newline_inside_a_string_is_refused() -> None:
    """Compiled in llama.cpp, after `{"issue": "The bill`: a raw newline is not a token the
    grammar lets through (with the converter's own char rule it was), an escaped one is."""
    import ctypes
    import math

    import llama_cpp as ll

    from tokenq.shared.settings import get_settings
    from tokenq.shared.vocab import Vocab
    from tokenq.shared.weights import gguf_path
    from tokenq.workers.engines.llamacpp_sampling import compile_grammar

    s = get_settings()
    cfg = s.models()[s.default_model]
    vocab = Vocab(gguf_path(cfg, s.state_dir), cfg, vocab_only=True)
    grammar = compile_grammar(vocab.vocab, SUMMARY_SCHEMA)
    try:
        for tok in vocab.tokenize('{"issue": "The bill', add_special=False):
            ll.llama_sampler_accept(grammar, tok)
        (raw,) = vocab.tokenize("\n", add_special=False)
        escaped = vocab.tokenize("\\n", add_special=False)[0]
        data = (ll.llama_token_data * 2)(ll.llama_token_data(raw, 1.0, 0.0),
                                         ll.llama_token_data(escaped, 1.0, 0.0))
        arr = ll.llama_token_data_array(data, 2, -1, False)
        ll.llama_sampler_apply(grammar, ctypes.byref(arr))
        assert math.isinf(data[0].logit) and data[0].logit < 0, "a raw newline got through"
        assert data[1].logit == 1.0
    finally:
        ll.llama_sampler_free(grammar)
        vocab.close()
