"""Budgets on a JSON schema before it becomes a grammar (structured output).

llama.cpp expands a bounded repetition (`maxLength`, `minItems`, a regex `{m,n}`)
into one nested rule per repetition when it compiles the grammar; past a few
thousand its grammar builder overflows the engine thread's stack (a segfault: the
whole worker dies, and with it every job it held) or allocates without bound. The
API checks these budgets on every schema before anything is enqueued, so a schema
over them is a 400, not a dead worker. docs/reliability.md has the figures.

The walk is iterative (a schema nested thousands deep is refused, not a
RecursionError), and looks at every object in the schema document: each one that
can be a subschema counts as a node; `const`, `enum`, `default` and `examples`
hold data, only their size counts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tokenq.shared.json_grammar import int_range
from tokenq.shared.pattern_states import PatternTooAmbiguous, pattern_states
from tokenq.shared.schema_keywords import DATA_KEYWORDS, has_bounds, int_bounds
from tokenq.shared.settings import Settings

# Keywords whose integer value becomes a repetition count in the grammar.
REPEAT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                   "maxProperties", "minContains", "maxContains")
# A bounded integer's range rule counts one per this many characters of it: 900 integers
# between -123456789012345 and 987654321098765 were 1.75 MB of grammar, 3.3 s to write and
# 4.1 s to compile (on the engine's thread); now ~100 of them fit the size budget.
RANGE_CHARS = 10
# A regex quantifier {m}, {m,} or {m,n}
QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


@dataclass(frozen=True, slots=True)
class GrammarBudget:
    max_repeat: int = 1000  # any repetition count (min/max Length/Items/..., {m,n})
    max_depth: int = 32  # nesting of objects and arrays in the schema document
    max_nodes: int = 1000  # objects in the schema document (subschemas, properties)
    max_enum: int = 256  # values of one enum
    max_pattern: int = 512  # characters of one `pattern`
    max_size: int = 20_000  # the estimated grammar size (below)
    max_pattern_states: int = 256  # readings one `pattern` keeps at once (pattern_states.py)


class SchemaOverBudget(ValueError):
    """The schema would compile into a grammar over the budget: `path` names where."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def _where(path: tuple[str, ...]) -> str:
    return "/".join(path) or "(root)"


def estimate(schema: Any, budget: GrammarBudget) -> int:
    """Raise SchemaOverBudget where the schema exceeds a budget; else its estimated
    grammar size: one per node, plus every repetition count (llama.cpp makes one rule per
    repetition), plus the characters of patterns and data (enum, const)."""
    size = 0
    nodes = 0
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(schema, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > budget.max_depth:
            raise SchemaOverBudget(f"the schema is nested more than {budget.max_depth} levels "
                                   "deep", _where(path))
        if isinstance(node, list):
            stack.extend((v, depth + 1, (*path, str(i))) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > budget.max_nodes:
            raise SchemaOverBudget(f"the schema has more than {budget.max_nodes} objects "
                                   "(subschemas and properties)", _where(path))
        size += 1 + _keywords(node, budget, path)
        for key, value in node.items():
            if key not in DATA_KEYWORDS and isinstance(value, dict | list):
                stack.append((value, depth + 1, (*path, str(key))))
        if size > budget.max_size:
            raise SchemaOverBudget(f"the schema would compile into a grammar of more than "
                                   f"{budget.max_size} rules (repetition counts, patterns, "
                                   "enums and subschemas add up)", _where(path))
    return size


def _keywords(node: dict[str, Any], budget: GrammarBudget, path: tuple[str, ...]) -> int:
    """Check one object's own keywords; their contribution to the size."""
    size = 0
    if has_bounds(node):  # spelled digit by digit: up to ~2,000 characters of grammar
        try:
            size += len(int_range(*int_bounds(node))) // RANGE_CHARS
        except ValueError:
            pass  # nothing satisfies it: refused later (schema_keywords.check)
    for key in REPEAT_KEYWORDS:
        value = node.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            if value > budget.max_repeat:
                raise SchemaOverBudget(f"{key} is {value:g}; at most {budget.max_repeat} is "
                                       "accepted in a response schema", _where((*path, key)))
            size += max(0, int(value))
    pattern = node.get("pattern")
    if isinstance(pattern, str):
        if len(pattern) > budget.max_pattern:
            raise SchemaOverBudget(f"pattern has {len(pattern)} characters; at most "
                                   f"{budget.max_pattern}", _where((*path, "pattern")))
        for m in QUANTIFIER.finditer(pattern):
            bound = max(int(m.group(1)), int(m.group(2) or 0))
            if bound > budget.max_repeat:
                raise SchemaOverBudget(f"pattern repeats {bound} times ({m.group(0)}); at most "
                                       f"{budget.max_repeat}", _where((*path, "pattern")))
            size += bound
        try:
            pattern_states(pattern, budget.max_pattern_states)
        except PatternTooAmbiguous as exc:
            raise SchemaOverBudget(f"pattern: {exc}", _where((*path, "pattern"))) from exc
        size += len(pattern)
    enum = node.get("enum")
    if isinstance(enum, list):
        if len(enum) > budget.max_enum:
            raise SchemaOverBudget(f"enum has {len(enum)} values; at most {budget.max_enum}",
                                   _where((*path, "enum")))
        size += _data_size(enum)
    if "const" in node:
        size += _data_size(node["const"])
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        # llama.cpp's converter would fetch it (a request from the worker to anywhere)
        raise SchemaOverBudget("$ref must point inside the schema (start with '#')",
                               _where((*path, "$ref")))
    return size


def _data_size(value: Any) -> int:
    try:
        return len(json.dumps(value)) // 8 + 1
    except (TypeError, ValueError, RecursionError):
        return 1 << 30  # not serialisable, or nested past Python's own limit: over budget


UNLIMITED = 1 << 62


def budget_of(s: Settings) -> GrammarBudget:
    """The settings' budgets (0 lifts one)."""
    def lim(v: int) -> int:
        return v or UNLIMITED

    a = s.api
    return GrammarBudget(max_repeat=lim(a.schema_max_repeat), max_depth=lim(a.schema_max_depth),
                         max_nodes=lim(a.schema_max_nodes), max_enum=lim(a.schema_max_enum),
                         max_pattern=lim(a.schema_max_pattern),
                         max_size=lim(a.schema_max_grammar),
                         max_pattern_states=lim(a.schema_max_pattern_states))


def nesting(value: Any) -> int:
    """How deep objects and arrays nest in a JSON value (iterative: no recursion limit)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth)
            todo.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
