r"""A JSON schema's GBNF grammar for llama.cpp.

llama-cpp-python's converter (`json_schema_to_gbnf`, a port of an older llama.cpp) admits
in a string the control characters JSON forbids there (a raw newline, a tab) and DEL, so
a job could end with `stop` and still not parse. Its `char` rule is replaced by llama.cpp's
own (common/json-schema-to-grammar, what llama-server compiles for `response_format`):
no \x00-\x1F, no \x7F; escapes as JSON allows them.

Its whitespace is kept on purpose: one optional blank between tokens, where llama.cpp
allows one or two newlines and 20 blanks of indentation. Measured on the post-call
transcripts with SmolLM2 at temperature 0 (34 prompts, max_tokens 256): 29/34 summaries
valid with the compact whitespace, 22/34 with llama.cpp's (the model pretty-printed, then
looped inside Korean strings); compact JSON also spends no tokens on indentation.

Two gaps of the converter are closed before it runs (`for_converter`), and what it still
cannot convert is a ValueError, which the API answers with a 400 before enqueueing
(api/admission.py), not a job failed on the worker:
- a root `$ref` (pydantic's recursive models: `{"$ref": "#/$defs/Node", "$defs": ...}`)
  raised a KeyError; the root now takes the referenced schema's place, its `$defs` kept,
  so recursion through properties still works;
- `\d`, `\w`, `\s` and escaped punctuation (`\.`) in a `pattern` went to llama.cpp's
  grammar parser as they were, and it knows no such escape; they are written as the
  classes they stand for (`\D`, `\W`, `\S` too, outside a class) and as hex escapes.

The converter ignores an integer's `minimum`/`maximum` (and the exclusive ones): a
"rating from 1 to 5" came back as 1234567890123456 with `stop`. Such an integer is
handed to the converter as a placeholder constant, and the placeholder's literal in its
grammar replaced by a rule that spells the range digit by digit (`int_range`), as
llama.cpp's own converter does. Keywords no grammar here enforces are listed, and refused
under `strict`, in shared/schema_keywords.py.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from tokenq.shared.schema_keywords import DATA_KEYWORDS, has_bounds, int_bounds
from tokenq.shared.schema_meta import Remembered, canonical

CHAR_RULE = r'char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
RULES = {"char": CHAR_RULE}


# what \d, \w and \s stand for, as the body of a GBNF character class
CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": " \\t\\n\\r"}
MAX_DIGITS = 16  # the converter's integers have at most 16 digits


# Grammars converted, by their schema's canonical text: the converter is Python, ~0.5 s
# for a schema at the budgets' edge (900 properties), paid by the API's check, the worker's
# check and the engine thread's compile of every job; a batch's lines share one schema.
_converted: Remembered[str] = Remembered(256)


def schema_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF of `schema` (root rule `root`); ValueError for what cannot be converted.
    Remembered: the same schema is converted once."""
    key = canonical(schema)
    if (gbnf := _converted.get(key)) is None:
        gbnf = _convert(schema)
        _converted.put(key, gbnf)
    return gbnf


def _convert(schema: dict[str, Any]) -> str:
    """The GBNF of `schema` (root rule `root`); ValueError for what cannot be converted.
    llama_cpp is imported here, not at start-up: the worker sets libgomp's settings before
    llama.cpp's library loads (workers/main.py)."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    ranges: dict[str, str] = {}
    try:
        converted = json_schema_to_gbnf(json.dumps(for_converter(schema, ranges)))
    except (AssertionError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise ValueError(f"the schema cannot be turned into a grammar: {exc}") from exc
    lines = []
    for line in converted.splitlines():
        name = line.split("::=", 1)[0].strip() if "::=" in line else ""
        line = RULES.get(name, line)
        for i, placeholder in enumerate(ranges):
            line = line.replace(f'"\\"{placeholder}\\""', f"int-range-{i}")
        lines.append(line)
    lines += [f"int-range-{i} ::= ({body}) space" for i, body in enumerate(ranges.values())]
    return "\n".join(lines) + "\n"


def for_converter(schema: dict[str, Any],
                  ranges: dict[str, str] | None = None) -> dict[str, Any]:
    """A copy of `schema` with its root `$ref` resolved, its patterns' class escapes
    written out, and each bounded integer a placeholder constant whose range rule goes
    into `ranges` (the module's docstring)."""
    out: dict[str, Any] = json.loads(json.dumps(schema))
    seen: set[str] = set()
    while isinstance(ref := out.get("$ref"), str) and ref.startswith("#/"):
        if ref in seen:
            raise ValueError(f"$ref {ref!r} points only at itself")
        seen.add(ref)
        target: Any = out
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"$ref {ref!r} points at nothing in the schema")
            target = target[part]
        if not isinstance(target, dict):
            raise ValueError(f"$ref {ref!r} does not point at a schema")
        rest = {k: v for k, v in out.items() if k != "$ref"}
        out = {**json.loads(json.dumps(target)), **{k: v for k, v in rest.items()
                                                     if k in ("$defs", "definitions")}}
    todo: list[Any] = [out]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
        elif isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                node["pattern"] = pattern_classes(node["pattern"])
            if ranges is not None and has_bounds(node):
                placeholder = f"tokenq-int-range-{secrets.token_hex(8)}"
                ranges[placeholder] = int_range(*int_bounds(node))
                node.clear()
                node["const"] = placeholder
            todo.extend(v for k, v in node.items() if k not in DATA_KEYWORDS)
    return out


def pattern_classes(pattern: str) -> str:
    """`\\d`, `\\w`, `\\s` as character classes (inside a class, their ranges), and an
    escaped punctuation mark (`\\.`, `\\-`, `\\(`, ...) as its hex escape, the only
    form of it llama.cpp's grammar parser takes in a class."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        nxt = pattern[i + 1] if i + 1 < len(pattern) else ""
        if c == "\\" and nxt.lower() in CLASSES and (not in_class or nxt.islower()):
            body = CLASSES[nxt.lower()]
            out.append(body if in_class else f"[{'^' if nxt.isupper() else ''}{body}]")
        elif c == "\\" and nxt and not nxt.isalnum() and nxt.isascii() and nxt.isprintable():
            hexed = f"\\x{ord(nxt):02X}"
            out.append(hexed if in_class else f"[{hexed}]")
        elif c == "\\":
            out.append(pattern[i:i + 2])
        else:
            if c == "[" and not in_class:
                in_class = True
            elif c == "]" and in_class:
                in_class = False
            out.append(c)
            i += 1
            continue
        i += 2
    return "".join(out)


def int_range(lo: int | None, hi: int | None) -> str:
    """GBNF alternatives for exactly the JSON integers in [lo, hi] (None: unbounded), of at
    most MAX_DIGITS digits; ValueError when none is."""
    top = 10 ** MAX_DIGITS - 1
    lo = -top if lo is None else max(lo, -top)
    hi = top if hi is None else min(hi, top)
    if lo > hi:
        raise ValueError(f"no integer lies between {lo} and {hi}")
    alts: list[str] = []
    if lo < 0:  # magnitudes of the negatives, after a "-"
        alts += [f'"-" {a}' for a in _naturals(max(1, -hi) if hi < 0 else 1, -lo)]
    if hi >= 0:
        alts += _naturals(max(lo, 0), hi)
    return " | ".join(alts)


def _naturals(lo: int, hi: int) -> list[str]:
    """Alternatives for lo..hi (0 <= lo <= hi), without leading zeros: one block of
    alternatives per digit count."""
    out: list[str] = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        a, b = max(lo, 10 ** (digits - 1) if digits > 1 else 0), min(hi, 10 ** digits - 1)
        if a <= b:
            out += _same_length(str(a), str(b))
    return out


def _same_length(a: str, b: str) -> list[str]:
    """Alternatives for the digit strings from a to b, both of one length."""
    if a == b:
        return [f'"{a}"']
    if a[0] == b[0]:
        return [f'"{a[0]}" {rest}' for rest in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    tail = f" [0-9]{{{n}}}" if n else ""
    out: list[str] = []
    first, last = int(a[0]), int(b[0])
    if a[1:] != "0" * n:  # a[0] then at least a's rest
        out += [f'"{a[0]}" {rest}' for rest in _same_length(a[1:], "9" * n)]
        first += 1
    if b[1:] != "9" * n:  # b[0] then at most b's rest
        out += [f'"{b[0]}" {rest}' for rest in _same_length("0" * n, b[1:])]
        last -= 1
    if first <= last:
        out.append((f'"{first}"' if first == last else f"[{first}-{last}]") + tail)
    return out
