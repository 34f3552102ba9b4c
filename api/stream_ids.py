"""A job stream's entry ids: parsed, checked strictly (every cursor a client sends), and
where a resume with Last-Event-ID starts."""

from __future__ import annotations

import re
from typing import Any

import redis.asyncio as aioredis

from tokenq.shared.schemas import TERMINAL_EVENTS

# A resume cursor past a running stream's end is kept (not read as the end) when its time
# is at most this far ahead of Redis' clock: primaries' clocks differ a little.
RESUME_SKEW_MS = 5000

# A stream entry id exactly as Redis writes them: `<ms>-<seq>`, ASCII digits, each part
# at most 2^64-1. Python's int() is far looser (`1_0`, ` 1`, `+1`, Arabic-Indic digits):
# every cursor a client sends is checked against this before it can reach the shared XREAD.
_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_U64 = 2**64 - 1


def parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def is_valid_id(entry_id: str) -> bool:
    m = _ID.fullmatch(entry_id)
    return m is not None and int(m[1]) <= _U64 and int(m[2]) <= _U64


async def resume_point(r: aioredis.Redis, key: str, after: str) -> str | None:
    """Where a resume with Last-Event-ID `after` starts: None when nothing can follow (the
    stream's terminal event is at or before `after`: the route answers 204, which tells an
    EventSource to stop reconnecting). A cursor past a running stream's last entry is kept
    if it is no later than Redis' clock (plus RESUME_SKEW_MS): it may be an id the client
    read before a failover lost it, which the worker writes again. One from the future was
    never an id of this stream: it is taken as the last entry, so the client gets what
    comes next instead of waiting for ids that will never be written."""
    last: Any = await r.xrevrange(key, count=1)
    if not last:
        return after
    last_id, fields = last[0]
    if parse_id(after) < parse_id(last_id):
        return after
    if fields.get("e") in TERMINAL_EVENTS:
        return None
    # Past the end of a running stream: the worker re-sends lost tokens with their ids
    # (workers/publisher.py), so a cursor that is not from the future is kept.
    now: Any = await r.time()
    if parse_id(after)[0] <= int(now[0]) * 1000 + int(now[1]) // 1000 + RESUME_SKEW_MS:
        return after
    return str(last_id)
