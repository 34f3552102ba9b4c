"""The shapes of the ids the API hands out. An id a request carries goes into a Redis key
name, so one of another shape is a 404 before any key is read: `<job id>:events` named
the job's stream, a key of another type, and Redis's WRONGTYPE became a retryable 503
("the job store is unavailable") that also told the id existed."""

from __future__ import annotations

import re

from tokenq.api.errors import NotFound

# job_<hex> (a batch line's: job_<batch hex>_<line>), file-<hex> (a batch's output and
# error files: file-<batch hex>o / e), batch_<hex>
SHAPES = {
    "job": re.compile(r"job_[0-9a-f]{32}(?:_[0-9]{1,9})?"),
    "file": re.compile(r"file-[0-9a-f]{32}[oe]?"),
    "batch": re.compile(r"batch_[0-9a-f]{32}"),
}


def check(kind: str, value: str, param: str) -> None:
    """NotFound (as for an id that does not exist) unless `value` has `kind`'s shape."""
    if not SHAPES[kind].fullmatch(value):
        raise NotFound(f"no {kind} {value[:128]!r}", param=param)
