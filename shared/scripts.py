"""The Lua script registry: every script tokenq runs in Redis, loaded from shared/lua/.

Each `shared/lua/<name>.lua` opens with what it does, what it returns, and its KEYS and
ARGV bound to named locals. A line `--#include terminal` pulls in the library
`terminal.lua` (the one terminal transition and its batch/webhook bookkeeping). Key
prefixes the scripts build themselves (which batch a job belongs to is only known
inside Redis) are written `@BATCH_PREFIX@` style and filled in from shared/keys.py.

Only the stores run scripts (shared/store.py: jobs; api/openai/batch_store.py: batches;
api/ratelimit.py: rate limits; workers/webhooks.py: the webhook outbox); everything else
calls their typed methods.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

from shared import keys

LUA_DIR = Path(__file__).parent / "lua"
NAMES = ("create", "acquire", "append", "finish", "cancel", "requeue", "handback",
         "preempt", "renew_job", "renew", "settle", "release", "take", "claim", "reject")
_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)
_CONSTANT = re.compile(r"@([A-Z_]+)@")
CONSTANTS = {
    "BATCH_PREFIX": keys.BATCH_PREFIX,
    "BATCHES_PENDING": keys.BATCHES_PENDING,
    "JOB_PREFIX": keys.JOB_PREFIX,
    "QUEUED": keys.QUEUED,
    "WEBHOOKS": keys.WEBHOOKS,
    "WEBHOOK_PREFIX": keys.WEBHOOK_PREFIX,
    "WEBHOOK_SEQ": keys.WEBHOOK_SEQ,
}


@cache
def source(name: str) -> str:
    """The script's Lua, includes and key prefixes resolved."""
    text = (LUA_DIR / f"{name}.lua").read_text()
    text = _INCLUDE.sub(lambda m: (LUA_DIR / f"{m.group(1)}.lua").read_text(), text)

    def constant(m: re.Match[str]) -> str:
        if m.group(1) not in CONSTANTS:
            raise KeyError(f"{name}.lua: unknown constant @{m.group(1)}@")
        return CONSTANTS[m.group(1)]

    return _CONSTANT.sub(constant, text)


class Scripts:
    """Every script registered on one client, sync or asyncio (EVALSHA, reloaded on
    NOSCRIPT after a Redis restart, and loaded before a pipeline runs)."""

    def __init__(self, r: Any, names: tuple[str, ...] = NAMES):
        self._scripts = {name: r.register_script(source(name)) for name in names}

    def __getitem__(self, name: str) -> Any:
        return self._scripts[name]
