"""The grammar budgets on JSON schemas (shared/schema_budget.py): what passes, what does
not, and that the walk survives any nesting without recursion."""

from __future__ import annotations

from typing import Any

import pytest

from tokenq.shared.schema_budget import GrammarBudget, SchemaOverBudget, budget_of, estimate
from tokenq.shared.settings import Settings

B = GrammarBudget()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 1000},
                                      "tags": {"type": "array", "maxItems": 1000,
                                               "items": {"enum": ["a", "b"]}}}},
    {"type": "string", "pattern": "^[a-z]{1,1000}$"},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
     "$ref": "#/$defs/n"},
    {"const": {"maxLength": 10**9}},  # data, not a keyword
    {"properties": {"maxLength": {"type": "string"}}},
])
def test_within_budget(schema: dict[str, Any]) -> None:
    assert estimate(schema, B) > 0


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "string", "maxLength": 20000}, "maxLength"),
    ({"type": "string", "minLength": 1001}, "minLength"),
    ({"type": "array", "minItems": 100000}, "minItems"),
    ({"properties": {"a": {"type": "array", "maxItems": 5000}}}, "properties/a/maxItems"),
    ({"type": "string", "pattern": "a{2,20000}"}, "pattern"),
    ({"type": "string", "pattern": "a" * 600}, "pattern"),
    ({"enum": list(range(300))}, "enum"),
    ({"$ref": "https://example.com/schema.json"}, "$ref"),
    ({"type": "string", "pattern": "^(((a{0,20}){0,20}){0,20})$"}, "pattern"),
    ({"properties": {"p": {"pattern": "x)((a?){0,40})"}}}, "properties/p/pattern"),
    ({"properties": {f"p{i}": {"maxLength": 1000} for i in range(25)}}, ""),
])
def test_over_budget(schema: dict[str, Any], where: str) -> None:
    with pytest.raises(SchemaOverBudget) as exc:
        estimate(schema, B)
    assert exc.value.path.endswith(where)


def test_deep_nesting_is_refused_without_recursion() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):  # built in a loop: json.loads itself stops near 1,000 levels
        deep = {"items": deep}
    with pytest.raises(SchemaOverBudget, match="nested"):
        estimate(deep, B)


def test_zero_lifts_a_budget() -> None:
    lifted = budget_of(Settings(api={"schema_max_repeat": 0, "schema_max_grammar": 0}))
    assert estimate({"type": "string", "maxLength": 20000}, lifted) > 20000
    assert budget_of(Settings()) == GrammarBudget()


@pytest.mark.parametrize(("pattern", "ok"), [
    ("^(((a{0,20}){0,20}){0,20})$", False),  # an outside tester's: froze a worker
    ("^((a{0,30}){0,30})$", False),  # ~1 s a token measured
    ("^(((a{1,10}){1,10}){1,10})$", False),  # ~150 ms a token
    ("^(a?){0,1000}$", False),  # nullable body: any repetition may be empty
    ("^(a{0,2}){0,100}$", False),  # ~3 s a token
    ("^(?=b)(((a{0,20}){0,20}){0,20}):$", False),  # a group mark is no place to skip from
    ("^(?<n>(((a{0,20}){0,20}){0,20}))$", False),
    # bounded repetitions of a class: one apply over the whole vocabulary, measured
    ("^(.{1,16}){1,16}$", False),  # an outside tester's: 26 s
    ("^([a-z ]{1,8}){1,8}$", False),  # 24-31 s
    ("^([a-z ]{1,6}){1,8}$", False),  # 3.0 s
    ("^([a-z ]{1,4}){1,16}$", False),  # over 100 s
    ("^([a-z ]{1,4}){1,8}$", True),  # 0.23 s
    ("^([a-z ]{1,8}){1,4}$", True),  # 0.06 s
    ("^([a-z]{1,20} ){1,5}$", True),  # a blank ends each word: 0.03 s
    ("^(\\w+\\s?){1,20}$", True),  # + is one recursive rule: 0.04 s
    ("^(?P<year>[0-9]{4})-(?:[0-9]{2})$", True),
    ("^a{0,1000}$", True),  # one reading however long
    ("^((a*)*)*$", True),  # unbounded repeats are one recursive rule each
    ("^([0-9]{1,3}\\.){3}[0-9]{1,3}$", True),
    ("^[A-Z]{2}[0-9]{2}[A-Z0-9]{1,30}$", True),
    ("^(cat|dog|bird){1,10}$", True),
    ("^(?:[a-z0-9]+(?:-[a-z0-9]+)*)$", True),
    ("((((", True), ("[", True), ("a{", True),  # unreadable: the compiler's to refuse
])
def test_pattern_states(pattern: str, ok: bool) -> None:
    """Nested repetitions over variable-length parts multiply the grammar's states; the
    counts alone (each far under max_repeat) do not show it."""
    schema = {"type": "string", "pattern": pattern}
    if ok:
        assert estimate(schema, B) > 0
    else:
        with pytest.raises(SchemaOverBudget, match="grammar states"):
            estimate(schema, B)
    lifted = budget_of(Settings(api={"schema_max_pattern_states": 0}))
    assert estimate(schema, lifted) > 0


def test_bounded_integers_count_their_range_rules() -> None:
    """A bounded integer is spelled digit by digit (shared/json_grammar.py): 900 of these
    were 1.75 MB of grammar, 3.3 s to write and 4.1 s to compile on the engine's thread."""
    wide = {"type": "integer", "minimum": -123456789012345, "maximum": 987654321098765}
    with pytest.raises(SchemaOverBudget, match="rules"):
        estimate({"type": "object", "properties": {f"p{i}": wide for i in range(200)}}, B)
    assert estimate({"type": "object", "properties": {f"p{i}": wide for i in range(90)}}, B)
    assert estimate({"type": "integer", "minimum": 1, "maximum": 5}, B) < 5
