"""A batch's cancel, swept by its driver (api/openai/batch_driver.py).

Queued lines end `cancelled` (counted by the job scripts); running ones finish (the cancel
script checks the state and ends a queued line in one step, so a line leased meanwhile is
left running), and the last of them to end settles the batch `cancelled`
(shared/lua/terminal.lua), its result in the output file. No line past the cursor is
enqueued once `enqueue_done` is set: those lines (every line, for a cancel while the batch
was validating; none for one before its driver read the file: `total` stays 0, as
OpenAI's) end `cancelled` too, without running, so a cancelled batch counts every
line of its `total` (completed + failed = total) and its error file lists each one that
did not run with `batch_cancelled`, however far the driver had got. A line never enqueued
gets no job record: an entry of the error file (shared/lua/batch_unrun.lua).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tokenq.api.openai.batch_lines import (
    INLINE_LINE_BYTES,
    MAX_PIPELINE,
    Source,
    custom_id_of,
    line_job_id,
)
from tokenq.shared import keys

if TYPE_CHECKING:
    from tokenq.api.openai.batch_driver import BatchDriver

log = logging.getLogger(__name__)


async def sweep(driver: BatchDriver, batch_id: str) -> None:
    s, r = driver.state.settings, driver.r
    bk = keys.batch(batch_id)
    await r.hset(bk, "enqueue_done", "1")
    cursor, total = (int(x or 0) for x in await r.hmget(bk, ["cursor", "total"]))
    # Lines just past the cursor may exist: written after a refused line of their chunk
    # (AsyncJobStore.create_many), or by a driver that died before saving the cursor.
    last = max(cursor, min(cursor + MAX_PIPELINE, total))
    for n in range(1, last + 1):
        await driver.state.jobs.cancel(line_job_id(batch_id, n), ttl=s.api.file_ttl_s,
                                       queued_only=True)
        if n % s.api.batch_chunk == 0:
            await driver.keep_lease(batch_id)
    enqueued = int(await r.hget(bk, "enqueued") or 0)
    if enqueued < total:
        h: dict[str, str] = await r.hgetall(bk)  # type: ignore[assignment]
        await _cancel_rest(driver, h, cursor, total - enqueued)
    await r.hset(bk, "swept", "1")


async def _cancel_rest(driver: BatchDriver, h: dict[str, str], cursor: int,
                       missing: int) -> None:
    """The `missing` lines never enqueued (past the cursor; a line there that exists is
    skipped) end `cancelled` as error-file entries (shared/lua/batch_unrun.lua), with their
    custom_ids from the input file; a file deleted meanwhile leaves the rest with none ("")."""
    s, batch_id = driver.state.settings, h["id"]
    size = max(1, min(s.api.batch_chunk, MAX_PIPELINE))
    chunk: list[tuple[int, str]] = []

    async def flush() -> None:
        nonlocal missing
        missing -= await driver.batches.unrun(batch_id, chunk)
        chunk.clear()
        await driver.keep_lease(batch_id)

    source, n = Source(), cursor
    async for line in driver.lines(h, source):
        if source.gone or missing <= 0:
            break
        if line.n <= cursor:
            continue
        n = line.n
        cid = custom_id_of(line.data) if len(line.data) <= INLINE_LINE_BYTES else \
            await driver.state.counter.pool.run(h["owner"], custom_id_of, line.data)
        # (lines past the cursor may have jobs: they are not counted here, so the file is
        # read on until `missing` lines were; stopping at `missing` read lines named the
        # rest "" though the file was there)
        chunk.append((n, cid))
        if len(chunk) >= size:
            await flush()
    await flush()
    while missing > 0:  # the file is gone: the lines after the last one read, unnamed
        chunk.extend((n + k, "") for k in range(1, min(missing, size) + 1))
        n += len(chunk)
        await flush()
    log.info("batch %s: lines not enqueued before the cancel ended cancelled", batch_id)
