"""The JSON-schema grammar llama.cpp workers compile: llama-server's string rule over
llama-cpp-python's converter (shared/json_grammar.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tokenq.cli.transcripts import SUMMARY_SCHEMA
from tokenq.shared import json_grammar
from tokenq.shared.json_grammar import CHAR_RULE, int_range, pattern_classes, schema_gbnf


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


NODE = {"$defs": {"Node": {"type": "object", "title": "Node", "required": ["v", "kids"],
                           "properties": {"v": {"type": "integer"},
                                          "kids": {"type": "array",
                                                   "items": {"$ref": "#/$defs/Node"}}}}},
        "$ref": "#/$defs/Node"}  # what pydantic writes for a recursive model


@pytest.mark.parametrize(("pattern", "written"), [
    (r"^\d{3}-\d{4}$", "^[0-9]{3}-[0-9]{4}$"),
    (r"^[\d.]+$", "^[0-9.]+$"),
    (r"^\w+\s\W$", r"^[0-9A-Za-z_]+[ \t\n\r][^0-9A-Za-z_]$"),
    (r"^(\d{1,3}\.){3}\d{1,3}$", r"^([0-9]{1,3}[\x2E]){3}[0-9]{1,3}$"),
    (r"^[\w\-]+$", r"^[0-9A-Za-z_\x2D]+$"),
    (r"^a\\d$", r"^a[\x5C]d$"),  # an escaped backslash, then a plain d
    (r"^\x41\t$", r"^\x41\t$"),  # escapes GBNF knows stay
])
def test_pattern_escapes_become_classes_llama_cpp_parses(pattern: str, written: str) -> None:
    assert pattern_classes(pattern) == written


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "string", "pattern": "[a-z]+"}, "must start with"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "points only at itself"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
])
def test_what_the_converter_cannot_take_is_a_value_error(schema: dict[str, Any],
                                                         why: str) -> None:
    """The API answers these with a 400 before enqueueing (api/admission.py); they used
    to reach the worker as an AssertionError or a KeyError and fail the job there."""
    with pytest.raises(ValueError, match=why):
        schema_gbnf(schema)


@pytest.mark.parametrize(("schema", "text"), [
    (NODE, '{"v": 1, "kids": [{"v": 2, "kids": []}]}'),
    ({"type": "string", "pattern": r"^(\d{1,3}\.){3}\d{1,3}$"}, '"192.168.10.200"'),
    ({"type": "string", "pattern": r"^[\w.\-]+@[\w\-]+\.[a-z]{2,}$"}, '"j.doe@ex-ample.com"'),
    ({"type": "string", "pattern": r"^\(\d{3}\) \d{3}-\d{4}$"}, '"(555) 123-4567"'),
], ids=["recursive", "ip", "email", "phone"])
def test_llama_cpp_compiles_them_and_takes_a_matching_text(schema: dict[str, Any],
                                                           text: str) -> None:
    """Each failed to compile before (a KeyError; llama.cpp's "unknown escape")."""
    got = subprocess.run([sys.executable, "-m", "tests.faults.grammar_crash", json.dumps(schema),
                          text], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert got.returncode == 0, (got.stdout[-500:], got.stderr[-1500:])
    assert "slowest token" in got.stdout


@pytest.mark.parametrize(("lo", "hi"), [(1, 5), (0, 10), (-5, 5), (-100, -3), (7, 7), (0, 0),
                                        (13, 2024), (None, 10), (-3, None), (999, 1001),
                                        (-1234, 98765)])
def test_an_integer_range_is_spelled_exactly(lo: int | None, hi: int | None) -> None:
    """Every integer near the bounds (and past them) against the range's alternatives,
    read as a regex: in exactly when lo <= x <= hi; never a leading zero."""
    rx = re.compile("^(?:" + "|".join(a.replace('"', "").replace(" ", "")
                                      for a in int_range(lo, hi).split(" | ")) + ")$")
    for x in range((lo or -3000) - 60, (hi if hi is not None else 3000) + 60):
        assert bool(rx.match(str(x))) == ((lo is None or x >= lo) and (hi is None or x <= hi)), x
    assert not any(rx.match(t) for t in ("01", "-0", "00", "-01", ""))
    assert rx.match(str(10 ** 16 - 1)) if hi is None else True  # unbounded: 16 digits


BOUNDED = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                  "exclusiveMaximum": 11}}}


@pytest.mark.parametrize(("text", "taken"), [('{"n": 7}', True), ('{"n": 10}', True),
                                             ('{"n": 12}', False), ('{"n": 0', False),
                                             ('{"n": 5000', False)])
def test_llama_cpp_keeps_an_integer_within_its_bounds(text: str, taken: bool) -> None:
    """The converter ignored the bounds: any integer of up to 16 digits got through."""
    got = subprocess.run([sys.executable, "-m", "tests.faults.grammar_crash",
                          json.dumps(BOUNDED), text], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    if taken:
        assert got.returncode == 0 and "slowest token" in got.stdout, got.stdout[-500:]
    else:
        assert got.returncode == 3 and "refuses" in got.stdout, got.stdout[-500:]


def test_a_schema_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The converter is Python (~0.5 s at the budgets' edge): the API's check, the worker's
    check and the engine thread's compile of every job of a batch took it each time."""
    import llama_cpp.llama_grammar as converter

    calls: list[str] = []
    real = converter.json_schema_to_gbnf

    def counting(schema: str, *args: Any, **kwargs: Any) -> str:
        calls.append(schema)
        return real(schema, *args, **kwargs)

    monkeypatch.setattr(converter, "json_schema_to_gbnf", counting)
    tag = uuid.uuid4().hex  # a schema no other test converted
    schema = {"type": "object", "properties": {tag: {"type": "integer", "minimum": 1,
                                                     "maximum": 5}}, "required": [tag]}
    first = json_grammar.schema_gbnf(schema)
    again = json_grammar.schema_gbnf(json.loads(json.dumps(schema)))  # an equal copy
    assert first == again and len(calls) == 1
    other = json_grammar.schema_gbnf({**schema, "required": []})
    assert len(calls) == 2 and other != first
