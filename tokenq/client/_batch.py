"""Batch input encoding and progress comparison, shared by both clients."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tokenq.client.models import Batch


def encode_lines(requests: Iterable[dict[str, Any]], endpoint: str) -> bytes:
    """Request bodies -> the Batch API's JSONL (custom_id, method, url, body). A dict that
    already has `body` is taken as a whole line."""
    lines = []
    for n, req in enumerate(requests):
        line = req if "body" in req else {"custom_id": f"request-{n}", "method": "POST",
                                          "url": endpoint, "body": req}
        lines.append(json.dumps(line, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def progress_changed(before: Batch | None, now: Batch) -> bool:
    return before is None or (before.status, before.request_counts) != (
        now.status, now.request_counts)
