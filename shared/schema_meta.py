"""A request's JSON schemas checked against the 2020-12 meta-schema, remembered, and how
heavy a request's schemas are.

jsonschema's meta-schema check walks a schema at ~16 ms a KB here (0.74 s for 900
properties, 47 KB, within every budget): on the event loop, one tenant's schemas stood
every stream of the replica still (a batch of such lines for minutes, checked at
validation and again at enqueue). So the API checks a heavy request's schemas on its CPU
pool (api/admission.py `prepare`), and a schema that passed once (a batch's lines share
one) is not walked again: its canonical text's digest is remembered.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

from jsonschema import Draft202012Validator

# A request whose schemas (response_format's, every tool's parameters) hold more nodes
# than this is checked off the event loop: ~1 KB of schema, ~15 ms of the walk.
INLINE_NODES = 64
REMEMBERED = 1024  # digests of schemas that passed

V = TypeVar("V")


def canonical(schema: Any) -> str:
    """A schema's text with its keys sorted: equal schemas, equal texts."""
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)


class Remembered(Generic[V]):
    """The last `size` values by key, least recently used out first; safe across threads
    (the API's CPU pool, a worker's threads)."""

    def __init__(self, size: int):
        self.size = size
        self._values: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._values[key] = value
            while len(self._values) > self.size:
                self._values.popitem(last=False)


_passed: Remembered[bool] = Remembered(REMEMBERED)


def check(schema: dict[str, Any]) -> None:
    """Raises jsonschema's SchemaError where `schema` is not a valid 2020-12 schema."""
    digest = hashlib.sha256(canonical(schema).encode()).hexdigest()
    if _passed.get(digest):
        return
    Draft202012Validator.check_schema(schema)
    _passed.put(digest, True)


def heavy(*schemas: Any, limit: int = INLINE_NODES) -> bool:
    """Whether the schemas hold more than `limit` nodes (counting stops there)."""
    todo, seen = list(schemas), 0
    while todo:
        v = todo.pop()
        if isinstance(v, dict | list):
            seen += 1
            if seen > limit:
                return True
            todo.extend(v.values() if isinstance(v, dict) else v)
    return False
