"""Which JSON-schema keywords decoding enforces, and schemas no value can satisfy.

llama.cpp's grammar (shared/json_grammar.py) enforces a schema's shape: `type`,
`properties`, `required`, `additionalProperties`, `items`/`prefixItems`, `enum`, `const`,
`anyOf`/`oneOf`, object `allOf`, `$ref`, and: `minLength`/`maxLength` on a string,
`minItems`/`maxItems` on an array of `items`, `pattern`, `format` date, time, date-time
and uuid, and `minimum`/`maximum` (and the exclusive ones) on an integer. Any other keyword
shapes nothing: a reply could end with `stop` and break it. So (api/admission.py and
api/openai/tools.py):
- a schema with `strict: true` that uses a keyword decoding does not enforce is a 400
  naming it, as OpenAI's strict mode refuses what it cannot guarantee;
- without `strict`, such keywords are accepted and not enforced (llama-server's and
  vLLM's behaviour), and documented so (docs/api.md);
- a schema no value can satisfy (`minimum` over `maximum`, `minLength` over `maxLength`,
  `minItems` over `maxItems`, an empty `enum`) is a 400 either way.
"""

from __future__ import annotations

import math
from typing import Any

# keywords that hold data or annotations, never a subschema to walk into
DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# keywords no grammar here enforces, on any type
NEVER = frozenset({"multipleOf", "minProperties", "maxProperties", "patternProperties",
                   "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
                   "not", "if", "then", "else", "uniqueItems", "contains", "minContains",
                   "maxContains", "unevaluatedProperties", "unevaluatedItems"})
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                     "uuid5"})
# keywords whose value maps names to subschemas (the map itself is not a schema)
MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties",
                  "dependentSchemas"})
LIMIT = 10 ** 17  # beyond any integer the grammar writes (16 digits)


class SchemaRefused(ValueError):
    """A schema refused before anything is enqueued: `path` names where (JSON pointer)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return max(min(float(v), LIMIT), -LIMIT)


def int_bounds(node: dict[str, Any]) -> tuple[int | None, int | None]:
    """The closed range [lo, hi] an integer schema's bounds allow (None: unbounded)."""
    los, his = [], []
    if (v := _num(node.get("minimum"))) is not None:
        los.append(math.ceil(v))
    if (v := _num(node.get("exclusiveMinimum"))) is not None:
        los.append(math.floor(v) + 1)
    if (v := _num(node.get("maximum"))) is not None:
        his.append(math.floor(v))
    if (v := _num(node.get("exclusiveMaximum"))) is not None:
        his.append(math.ceil(v) - 1)
    return (max(los) if los else None), (min(his) if his else None)


def has_bounds(node: dict[str, Any]) -> bool:
    return node.get("type") == "integer" and any(k in node for k in BOUNDS) \
        and "enum" not in node and "const" not in node


def _unenforced(node: dict[str, Any]) -> list[str]:
    typ = node.get("type")
    shaped = "enum" in node or "const" in node  # the value list wins over the rest
    out = [k for k in node if k in NEVER]
    if any(k in node for k in BOUNDS) and not (typ == "integer" or shaped):
        out += [k for k in BOUNDS if k in node]
    if ("minLength" in node or "maxLength" in node) and not shaped and (
            typ != "string" or "pattern" in node or "format" in node):
        out += [k for k in ("minLength", "maxLength") if k in node]
    if ("minItems" in node or "maxItems" in node) and not shaped and (
            not isinstance(node.get("items"), dict) or "prefixItems" in node):
        out += [k for k in ("minItems", "maxItems") if k in node]
    if "format" in node and not shaped and (node["format"] not in FORMATS
                                            or "pattern" in node):
        out.append("format")
    if "allOf" in node and not all(isinstance(s, dict) and ("properties" in s or "$ref" in s)
                                   for s in node["allOf"] or [None]):
        out.append("allOf")
    return out


def _unsatisfiable(node: dict[str, Any]) -> str | None:
    if node.get("enum") == []:
        return "enum is empty: no value can match"
    if node.get("type") == "integer":
        lo, hi = int_bounds(node)
        if lo is not None and hi is not None and lo > hi:
            return f"no integer lies between its bounds ({lo} > {hi})"
    else:
        lo_f, hi_f = _num(node.get("minimum")), _num(node.get("maximum"))
        if lo_f is not None and hi_f is not None and lo_f > hi_f:
            return f"minimum {lo_f:g} is over maximum {hi_f:g}"
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems")):
        a, b = node.get(low), node.get(high)
        if isinstance(a, int) and isinstance(b, int) and a > b:
            return f"{low} {a} is over {high} {b}"
    return None


def check(schema: Any, strict: bool) -> None:
    """Raise SchemaRefused for a schema no value satisfies, and, when `strict`, for a
    keyword decoding does not enforce (the module's docstring)."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{path}/{i}") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if (why := _unsatisfiable(node)) is not None:
            raise SchemaRefused(why, path or "/")
        if strict and (keys := _unenforced(node)):
            raise SchemaRefused(
                f"{', '.join(sorted(set(keys)))} cannot be enforced while decoding; remove "
                "it, or send the schema without strict: true to have it ignored", path or "/")
        for key, value in node.items():
            if key in MAPS and isinstance(value, dict):
                stack.extend((v, f"{path}/{key}/{k}") for k, v in value.items())
            elif key not in DATA_KEYWORDS and isinstance(value, dict | list):
                stack.append((value, f"{path}/{key}"))
