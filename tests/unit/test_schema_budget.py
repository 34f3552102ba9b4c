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
