"""A batch's validation, by its driver (api/openai/batch_driver.py): every line is checked
before any is enqueued (bad JSON, wrong `url`, duplicate `custom_id`, unknown model, a
request that would get a 400, too many lines); one bad line fails the batch with per-line
`errors` (OpenAI's batch error shape) and nothing enqueued. A cancel that lands meanwhile
wins (WATCH): the sweep then ends every valid line `cancelled`."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import WatchError

from tokenq.api.openai.batch_lines import MAX_BATCH_INPUTS, LineError, Source, too_long
from tokenq.shared import keys
from tokenq.shared.jobs import dumps

if TYPE_CHECKING:
    from tokenq.api.openai.batch_driver import BatchDriver

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 100


def gone_error(h: dict[str, str], enqueued: int) -> dict[str, Any]:
    """The batch error of an input file deleted before its lines were all enqueued."""
    ran = "no line was run" if not enqueued else \
        f"the {enqueued} lines enqueued before run; the others were not"
    return {"code": "input_file_deleted", "param": "input_file_id", "line": None,
            "message": f"the input file {h['input_file_id']} was deleted (or expired) "
                       f"before the batch's lines were enqueued: {ran}"}


async def validate(driver: BatchDriver, h: dict[str, str]) -> str:
    """Check every line; either the batch goes in_progress with its total, or failed."""
    s, batch_id = driver.state.settings, h["id"]
    errors: list[dict[str, Any]] = []
    total = bad = inputs = 0
    seen = keys.batch_ids(batch_id)
    await driver.r.delete(seen)
    source = Source()
    async for line in driver.lines(h, source):
        n = line.n
        total += 1
        if total > s.api.max_batch_lines:
            errors.append({"code": "too_many_lines", "line": n, "param": None,
                           "message": f"a batch holds at most {s.api.max_batch_lines} lines"})
            break
        try:
            if line.too_long:
                raise too_long(s.api.max_batch_line_bytes)
            custom_id, p = await driver.check_line(h, line.data)
            inputs += p.inputs
            if inputs > MAX_BATCH_INPUTS:
                errors.append({"code": "too_many_inputs", "line": n, "param": "body.input",
                               "message": f"a batch holds at most {MAX_BATCH_INPUTS} "
                                          "embedding inputs, all lines together"})
                break
            if not await driver.r.sadd(seen, custom_id):
                raise LineError("duplicate_custom_id",
                                f"custom_id {custom_id!r} appears more than once",
                                "custom_id")
        except Exception as exc:  # every line's failure is that line's error
            err = exc if isinstance(exc, LineError) else LineError(
                "invalid_request", f"the line could not be checked ({type(exc).__name__})")
            if not isinstance(exc, LineError):
                log.warning("batch %s line %d: %r", batch_id, n, exc)
            bad += 1
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append({"code": err.code, "message": err.message,
                               "param": err.param, "line": n})
        if total % s.api.batch_chunk == 0:
            await driver.keep_lease(batch_id)
    await driver.r.delete(seen)
    if bad > len(errors):
        errors.append({"code": "too_many_errors", "param": None, "line": None,
                       "message": f"{bad} lines have errors; the first "
                                  f"{MAX_REPORTED_ERRORS} are listed"})
    if source.gone:  # what was read may be cut short: the file is the only error
        errors, total = [gone_error(h, 0)], 0
    elif total == 0:
        errors.append({"code": "empty_file", "message": "the input file has no lines",
                       "param": None, "line": None})
    now = repr(time.time())
    if errors:
        fields = {"status": "failed", "failed_at": now, "total": "0",
                  "errors": dumps({"object": "list", "data": errors})}
        status = "failed"
    else:
        fields = {"status": "in_progress", "in_progress_at": now, "total": str(total)}
        status = "in_progress"
    bk = keys.batch(batch_id)
    async with driver.r.pipeline(transaction=True) as pipe:
        while True:  # the outcome is written unless a cancel came first (WATCH)
            try:
                await pipe.watch(bk)
                if await pipe.hget(bk, "status") == "cancelling":
                    # cancelled while validating: nothing was enqueued; the sweep ends
                    # every valid line `cancelled` (batch_cancel.py), none of an invalid
                    # file (its errors kept), and settles the batch
                    fields, status = {"total": "0" if errors else str(total),
                                      "enqueue_done": "1"}, "cancelling"
                    if errors:
                        fields["errors"] = dumps({"object": "list", "data": errors})
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.hset(bk, mapping=fields)  # type: ignore[arg-type]
                await pipe.execute()
                break
            except WatchError:
                continue
    if status == "failed":
        await driver.expire_failed(bk)
    log.info("batch %s: %d lines, %d errors -> %s", batch_id, total, len(errors), status)
    return status

