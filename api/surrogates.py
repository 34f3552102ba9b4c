"""Lone UTF-16 surrogates: JSON can spell one (`"\\ud800"`), Python decodes it into a str,
and nothing downstream can hold it (UTF-8 has no form for it: Redis's writer, pydantic's
serializer and the tokenizer raise); so can the bytes of one (json.loads decodes bytes
with `surrogatepass`). A body or batch line carrying one is a 400 naming
where, before any of them runs. Only a body with such an escape is decoded twice."""

from __future__ import annotations

import json
import re
from typing import Any

# a high or low surrogate, spelled as a JSON escape or in raw bytes (json.loads decodes
# bytes with `surrogatepass`, so both reach the routes as a str)
ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def where(doc: Any) -> str | None:
    """The path of the first string (or key) in `doc` holding a lone surrogate."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not node.isascii() and not _encodes(node):
                return path or "body"
        elif isinstance(node, list):
            stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node))
        elif isinstance(node, dict):
            for k, v in node.items():
                if not _encodes(k):
                    return path or "body"
                stack.append((v, f"{path}.{k}" if path else k))
    return None


def in_body(body: bytes) -> str | None:
    """where() for a JSON body; None when it has no surrogate escape or is not JSON
    (the route's own parser answers that)."""
    if not ESCAPE.search(body):
        return None
    try:
        return where(json.loads(body))
    except (ValueError, RecursionError):
        return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
