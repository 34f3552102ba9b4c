"""The Lua script registry: every script tokenq runs in Redis, loaded from shared/lua/.

Each `shared/lua/<name>.lua` opens with what it does, what it returns, and its KEYS and
ARGV bound to named locals. A line `--#include terminal` pulls in the library
`terminal.lua` (the one terminal transition and its batch/webhook bookkeeping). Key
prefixes the scripts build themselves (which batch a job belongs to is only known
inside Redis) are written `@BATCH_PREFIX@` style and filled in from shared/keys.py.

Only the stores run scripts (shared/store.py: jobs; api/openai/batch_store.py: batches;
api/openai/file_store.py: uploads; api/ratelimit.py: rate limits; workers/webhooks.py: the
webhook outbox); everything else calls their typed methods.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from tokenq.shared import keys

LUA_DIR = Path(__file__).parent / "lua"
NAMES = ("create", "acquire", "pick", "append", "finish", "cancel", "requeue", "handback",
         "preempt", "fair_victims", "renew_job", "renew", "settle", "release", "take", "claim",
         "reject", "move")
_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)
_CONSTANT = re.compile(r"@([A-Z_]+)@")
CONSTANTS = {
    "BATCH_PREFIX": keys.BATCH_PREFIX,
    "BATCHES_PENDING": keys.BATCHES_PENDING,
    "FILE_PREFIX": keys.FILE_PREFIX,
    "JOB_PREFIX": keys.JOB_PREFIX,
    "POOL_LOAD": keys.POOL_LOAD,
    "QUEUED": keys.QUEUED,
    "SHARE_PREFIX": keys.SHARE_PREFIX,
    "WEBHOOKS": keys.WEBHOOKS,
    "WEBHOOK_BELL": keys.WEBHOOK_BELL,
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
    """Every script registered on one client, sync or asyncio: called alone, EVALSHA,
    loaded again on NOSCRIPT (after a Redis restart or failover); queued on a pipeline, see
    `queue`."""

    def __init__(self, r: Any, names: tuple[str, ...] = NAMES):
        self._r = r
        self._scripts = {name: r.register_script(source(name)) for name in names}

    def __getitem__(self, name: str) -> Any:
        return self._scripts[name]

    def queue(self, pipe: Any, name: str, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue the script's EVALSHA on `pipe`, to execute with raise_on_error=False.

        Not redis-py's Script on a pipeline: that sends SCRIPT EXISTS before every
        execute, a round trip more each time (the worker's step write was two). Here a
        script Redis no longer has comes back in the answers as NoScriptError (`refused`);
        such an EVALSHA never ran, so the caller loads the script (`load`) and sends the
        refused calls again. Redis empties its script cache only whole (restart, failover, SCRIPT
        FLUSH), so the refused calls are the pipeline's tail: running them again in order
        keeps the pipeline's order."""
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def load(self, name: str) -> Any:
        """SCRIPT LOAD (awaitable on an asyncio client)."""
        return self._r.script_load(self._scripts[name].script)


def refused(answers: Sequence[Any]) -> list[int]:
    """Where a pipeline's EVALSHAs were refused for want of the script (see `queue`)."""
    return [i for i, x in enumerate(answers) if isinstance(x, NoScriptError)]


def raise_first_error(answers: Sequence[Any]) -> None:
    """As a pipeline executed with raise_on_error=True would: the first error, raised."""
    for x in answers:
        if isinstance(x, Exception):
            raise x
