"""Cancel a task and wait until it has ended, even where a cancellation can be lost.

On Python 3.11, `asyncio.wait_for` loses a cancellation that lands just as the call it
wraps finishes: it returns that call's result, and the task runs on as if never cancelled
(Python 3.12 rewrote `wait_for` and keeps it). redis-py wraps each socket write in
`wait_for` when the client has a socket timeout, as every client here does, so a task
cancelled while it sends a Redis command can go on. Seen in the API: a client that left
while its job was queued, at the moment its stream asked Redis for the job's position; the
stream's task ran on until the job ended, its hub subscription and the tenant's stream
count with it, and a SIGTERM waited the whole drain for it.

`cancel_and_wait` cancels, and cancels again every `again_s` until each task is done: a
lost cancellation costs `again_s`, not the task's lifetime.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

AGAIN_S = 0.5


async def cancel_and_wait(*tasks: asyncio.Future[Any], again_s: float = AGAIN_S) -> None:
    """Cancel `tasks` and wait until every one is done (their results and errors are the
    caller's to read). Cancelled itself meanwhile: cancels them once more and re-raises."""
    pending = {t for t in tasks if not t.done()}
    try:
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=again_s)
    except asyncio.CancelledError:
        for task in pending:
            task.cancel()
        raise


async def stop(task: asyncio.Task[Any], grace_s: float) -> None:
    """A task told to stop (its event set): `grace_s` to end by itself, then cancelled
    until it ends. Unlike `wait_for(task, grace_s)` on Python 3.11, which waits forever for
    a task whose cancellation was lost. Its error, if it raised one, is logged."""
    await asyncio.wait({task}, timeout=grace_s)
    await cancel_and_wait(task)
    if not task.cancelled() and task.exception() is not None:
        log.warning("%s ended with %r", task.get_name(), task.exception())
