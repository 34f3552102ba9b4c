"""Keywords decoding cannot enforce are refused under strict; unsatisfiable schemas always
(shared/schema_keywords.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenq.shared.schema_keywords import SchemaRefused, check, int_bounds

UNENFORCED = [
    ({"type": "integer", "multipleOf": 7}, "multipleOf", "/"),
    ({"type": "number", "minimum": 0.5, "maximum": 0.75}, "maximum, minimum", "/"),
    ({"type": "string", "format": "email"}, "format", "/"),
    ({"type": "object", "minProperties": 1}, "minProperties", "/"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$",
                                             "maxLength": 3}}}, "maxLength", "/properties/s"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "maxItems": 3}, "maxItems", "/"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf", "/"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "/"),
    ({"$defs": {"a": {"not": {"type": "null"}}}, "$ref": "#/$defs/a"}, "not", "/$defs/a"),
]


@pytest.mark.parametrize(("schema", "keys", "path"), UNENFORCED)
def test_strict_refuses_what_decoding_does_not_enforce(schema: dict[str, Any], keys: str,
                                                       path: str) -> None:
    with pytest.raises(SchemaRefused, match=f"^{keys} cannot be enforced") as info:
        check(schema, strict=True)
    assert info.value.path == path
    check(schema, strict=False)  # accepted, not enforced, without strict


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 1, "maximum": 10},
    {"type": "integer", "exclusiveMinimum": 0},
    {"type": "string", "minLength": 1, "maxLength": 20},
    {"type": "string", "format": "date-time"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"minimum": {"type": "string"}, "type": {"enum": [1]},
                                      "format": {"type": "string"}}},  # names, not keywords
    {"type": "integer", "enum": [1, 2], "maximum": 5},
    {"allOf": [{"properties": {"a": {"type": "string"}}}, {"$ref": "#/$defs/b"}],
     "$defs": {"b": {"properties": {"b": {"type": "integer"}}}}},
])
def test_what_decoding_enforces_passes_strict(schema: dict[str, Any]) -> None:
    check(schema, strict=True)


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "integer", "minimum": 5, "maximum": 1}, "no integer"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer"),
    ({"type": "integer", "minimum": 1.2, "maximum": 1.8}, "no integer"),
    ({"type": "number", "minimum": 2, "maximum": 1}, "over maximum"),
    ({"type": "string", "minLength": 5, "maxLength": 1}, "minLength 5 is over maxLength 1"),
    ({"type": "array", "items": {}, "minItems": 3, "maxItems": 2}, "minItems 3"),
    ({"type": "object", "properties": {"x": {"enum": []}}}, "enum is empty"),
])
def test_nothing_satisfies_them_strict_or_not(schema: dict[str, Any], why: str) -> None:
    for strict in (True, False):
        with pytest.raises(SchemaRefused, match=why):
            check(schema, strict)


def test_integer_bounds_read_every_form() -> None:
    assert int_bounds({"minimum": 1.5, "exclusiveMaximum": 10}) == (2, 9)
    assert int_bounds({"exclusiveMinimum": -1.5, "maximum": 9.9}) == (-1, 9)
    assert int_bounds({"minimum": True, "maximum": float("inf")}) == (None, None)
    assert int_bounds({"minimum": -10 ** 30}) == (-10 ** 17, None)
