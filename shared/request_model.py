"""The base of every model a client's request body is read into: OpenAI's types, not
pydantic's lax reading of them.

Pydantic reads `"stream": "yes"` as true, `"max_tokens": true` as 1 and `"max_tokens":
"5"` as 5; OpenAI's API refuses them, and a client that sends them has a bug it should hear
about. Before a request model validates, a field typed boolean takes only true/false (or
null where the field allows it), and a field typed as a number takes neither true/false nor
a string. The error names the field as its `param` (api/errors.py reads it)."""

from __future__ import annotations

import types
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, model_validator
from pydantic_core import PydanticCustomError

Kind = Literal["bool", "number"]


def _leaves(tp: Any) -> set[Any]:
    """The plain types a field annotation allows (Annotated, Optional and unions opened)."""
    origin = get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return set().union(*(_leaves(a) for a in get_args(tp)))
    if origin is not None and hasattr(tp, "__metadata__"):  # Annotated[...]
        return _leaves(get_args(tp)[0])
    return {origin or tp}


@cache
def scalar_kinds(cls: type[BaseModel]) -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for name, info in cls.model_fields.items():
        leaves = _leaves(info.annotation) - {type(None)}
        if leaves == {bool}:
            kinds[name] = "bool"
        elif leaves and leaves <= {int, float}:
            kinds[name] = "number"
    return kinds


class RequestModel(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _openai_scalars(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, kind in scalar_kinds(cls).items():
            v = data.get(name)
            if v is None:
                continue
            if kind == "bool" and not isinstance(v, bool):
                raise PydanticCustomError("bool_type", "{param}: expected true or false",
                                          {"param": name})
            if kind == "number" and isinstance(v, bool | str):
                raise PydanticCustomError("number_type", "{param}: expected a number, not "
                                          "{got}", {"param": name, "got": "a string" if
                                                    isinstance(v, str) else "true or false"})
        return data
