"""The shapes of the ids the API hands out. An id a request carries goes into a Redis key
name, so one of another shape is a 404 before any key is read: `<job id>:events` named
the job's stream, a key of another type, and Redis's WRONGTYPE became a retryable 503
("the job store is unavailable") that also told the id existed."""

from __future__ import annotations

import re

from tokenq.api.errors import NotFound

# job_<hex> (a batch line's: job_<batch hex>_<line>), file-<hex> (a batch's output and
# error files: file-<batch hex>o / e), batch_<hex>. Checked for the characters, not the
# exact form: the point is that no `:` (a key name's separator) nor anything else reaches
# the key name.
SHAPES = {
    "job": re.compile(r"job_[A-Za-z0-9_-]{1,80}"),
    "file": re.compile(r"file-[A-Za-z0-9_-]{1,80}"),
    "batch": re.compile(r"batch_[A-Za-z0-9_-]{1,80}"),
}


def check(kind: str, value: str, param: str) -> None:
    """NotFound (as for an id that does not exist) unless `value` has `kind`'s shape."""
    if not SHAPES[kind].fullmatch(value):
        raise NotFound(f"no {kind} {value[:128]!r}", param=param)
