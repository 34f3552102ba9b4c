"""The batch driver: validates a batch's input file, enqueues its lines, sweeps a cancel.

Every API replica runs one driver task. Batches that need work sit in the
`tokenq:batches:pending` set; a driver takes one with a lease key (SET NX PX)
and renews it between chunks, so a replica that dies mid-batch leaves it to
another within the lease TTL. Work is idempotent: job ids are derived from the
batch id and line number (CREATE skips an id that exists) and the cursor is
saved after each chunk; a chunk's lines are written in one pipelined round trip
(AsyncJobStore.create_many). The input file is read a piece at a time, so a
10,000-line batch never needs 10,000 objects in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from tokenq.api import admission, cpu, placement, service, surrogates
from tokenq.api.deps import AppState
from tokenq.api.errors import TokenqError
from tokenq.api.openai import files, jsonl, protocol
from tokenq.api.openai.batch_store import BatchStore
from tokenq.shared import keys
from tokenq.shared.jobs import Created, NewJob, NewRejection, QueueFull, TenantFull, dumps
from tokenq.shared.schemas import JobErrorInfo, JobRequest

log = logging.getLogger(__name__)

MAX_REPORTED_ERRORS = 100
MAX_DRIVER_FAILURES = 3  # tries of a batch whose processing raises, then it is given up
MAX_PIPELINE = 256  # lines enqueued per round trip at most, whatever batch_chunk says
BATCH_LANE_SHARE = 0.9  # of a lane's queue_limit, batch lines fill at most (batch_lane_limit)


# Lines up to this long are parsed on the event loop (well under a millisecond); longer
# ones on the CPU pool: json.loads and validating a 1 MB line take tens of milliseconds.
INLINE_LINE_BYTES = 64 * 1024


def batch_lane_limit(queue_limit: int) -> int:
    """How full batch lines may fill a lane (the `low` one they share with every tenant's
    own low-priority jobs): BATCH_LANE_SHARE of its limit, so one tenant's batch cannot
    lock the others out of it (a 12,000-line batch held it at 10,000 and every other
    tenant's `low` job got 429 until it drained). 0: no limit."""
    return max(1, int(queue_limit * BATCH_LANE_SHARE)) if queue_limit > 0 else 0


def line_job_id(batch_id: str, line: int) -> str:
    return f"job_{batch_id.removeprefix('batch_')}_{line}"


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def too_long(limit: int) -> LineError:
    return LineError("line_too_long", f"the line is longer than {limit} bytes, the limit of "
                     "one line (one request)")


def _parse_line(endpoint: str, raw: bytes) -> tuple[str, JobRequest]:
    """A line's custom_id and its request as a native job (no I/O: runs on a thread for a
    long line); raises LineError, or ValidationError from the request's model."""
    try:
        line = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LineError("invalid_json", f"the line is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise LineError("invalid_json", "the line is nested too deeply") from exc
    if not isinstance(line, dict):
        raise LineError("invalid_request", "each line must be a JSON object")
    if (path := surrogates.where(line)) is not None:
        raise LineError("invalid_text", f"{path} holds a lone UTF-16 surrogate, which no "
                        "text can carry", path)
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineError("missing_required_parameter", "custom_id must be a non-empty string",
                        "custom_id")
    if line.get("method", "POST") != "POST":
        raise LineError("invalid_request", "method must be POST", "method")
    if line.get("url") != endpoint:
        raise LineError("mismatched_url", f"url must be the batch's endpoint "
                        f"{endpoint}, not {line.get('url')!r}", "url")
    body = line.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", "body")
    req = protocol.parse(endpoint, body)
    if getattr(req, "stream", False):
        raise LineError("invalid_request", "stream is not allowed in a batch", "body.stream")
    if (req.n or 1) > 1 or req.log_k() is not None or getattr(req, "tools", None):
        raise LineError("invalid_request", "n > 1, logprobs and tools are served on "
                        "the interactive endpoints, not in batch lines", "body")
    job = req.to_job()
    job.priority = "low"  # live traffic first while a batch drains
    return custom_id, job


def _custom_id(raw: bytes) -> str:
    try:
        custom_id = str(json.loads(raw).get("custom_id") or "")
    except Exception:
        return ""
    return "" if surrogates.where(custom_id) else custom_id


class BatchDriver:
    def __init__(self, state: AppState):
        self.state = state
        self.r = state.redis
        self.me = uuid.uuid4().hex
        self.wake = asyncio.Event()
        self.batches = BatchStore(self.r, self.me)
        self._stopping = False

    async def run(self) -> None:
        cpu.PATIENT.set(True)  # lines wait for their tenant's share of the CPU pool, never 429
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=1.0)
            self.wake.clear()
            if self._stopping or self.state.draining:
                continue
            try:
                for batch_id in await self.batches.pending():
                    if await self.batches.take_lease(batch_id):
                        try:
                            await self.work_isolated(batch_id)
                        finally:
                            await self.batches.drop_lease(batch_id)
            except RedisError as exc:
                log.warning("batch driver: %s; retrying", exc)
            except Exception:
                log.exception("batch driver failed; retrying")

    async def work_isolated(self, batch_id: str) -> None:
        """`work`, where a batch that raises harms only itself: the next batches go on, and
        after MAX_DRIVER_FAILURES tries it is given up (`failed`, or no more lines enqueued)
        rather than retried every second for ever. A Redis error is nobody's fault: it is
        raised, and every batch is tried again when Redis is back."""
        try:
            await self.work(batch_id)
        except RedisError:
            raise
        except Exception as exc:
            n = int(await self.r.hincrby(keys.batch(batch_id), "driver_failures", 1))
            log.exception("batch %s: processing failed (%d of %d tries)", batch_id, n,
                          MAX_DRIVER_FAILURES)
            if n >= MAX_DRIVER_FAILURES:
                await self.give_up(batch_id, exc)

    async def give_up(self, batch_id: str, exc: Exception) -> None:
        bk = keys.batch(batch_id)
        status, enqueued = await self.r.hmget(bk, ["status", "enqueued"])
        error = {"code": "batch_processing_failed", "param": None, "line": None,
                 "message": f"the batch could not be processed ({type(exc).__name__}) after "
                            f"{MAX_DRIVER_FAILURES} tries; lines not yet enqueued were not run"}
        fields = {"errors": dumps({"object": "list", "data": [error]}), "enqueue_done": "1",
                  "swept": "1"}
        if status == "validating" or (status == "in_progress" and not int(enqueued or 0)):
            fields.update(status="failed", failed_at=repr(time.time()))
        await self.r.hset(bk, mapping=fields)  # type: ignore[arg-type]
        if await self.batches.settle(batch_id) != "validating":
            await self.batches.release(batch_id)
        log.error("batch %s: given up (%s)", batch_id, status)

    def stop(self) -> None:
        self._stopping = True
        self.wake.set()

    async def _keep_lease(self, batch_id: str) -> None:
        if not await self.batches.renew_lease(batch_id):
            raise RuntimeError(f"lost the driver lease of {batch_id}")

    async def work(self, batch_id: str) -> None:
        h: dict[str, str] = await self.r.hgetall(keys.batch(batch_id))  # type: ignore[assignment]
        if not h:
            await self.r.srem(keys.BATCHES_PENDING, batch_id)
            return
        if h["status"] == "validating":
            h["status"] = await self.validate(h)
        if h["status"] == "in_progress" and h.get("enqueue_done") != "1":
            await self.enqueue(h)
        if await self.r.hget(keys.batch(batch_id), "status") == "cancelling":
            await self.sweep_cancel(batch_id)
        if await self.batches.settle(batch_id) != "validating":
            await self.batches.release(batch_id)

    async def _check_line(self, h: dict[str, str], raw: bytes) -> tuple[str, admission.Prepared]:
        """A line's custom_id and its prepared job; a long line is parsed on the CPU pool in
        the batch owner's share (waiting for it: the driver is not refused)."""
        try:
            if len(raw) <= INLINE_LINE_BYTES:
                custom_id, job = _parse_line(h["endpoint"], raw)
            else:
                custom_id, job = await self.state.counter.pool.run(
                    h["owner"], _parse_line, h["endpoint"], raw)
            return custom_id, await admission.prepare(self.state, h["owner"], job)
        except ValidationError as exc:
            e = exc.errors()[0]
            param = ".".join(str(p) for p in e.get("loc", ()))
            raise LineError("invalid_request", f"{param or 'body'}: {e.get('msg')}",
                            f"body.{param}" if param else "body") from exc
        except TokenqError as exc:
            raise LineError(exc.code or "invalid_request", exc.message,
                            f"body.{exc.param}" if exc.param else None) from exc

    async def validate(self, h: dict[str, str]) -> str:
        """Check every line; either the batch goes in_progress with its total, or failed."""
        s, batch_id = self.state.settings, h["id"]
        errors: list[dict[str, Any]] = []
        total = bad = 0
        seen = keys.batch_ids(batch_id)
        await self.r.delete(seen)
        async for line in self._lines(h):
            n = line.n
            total += 1
            if total > s.api.max_batch_lines:
                errors.append({"code": "too_many_lines", "line": n, "param": None,
                               "message": f"a batch holds at most {s.api.max_batch_lines} lines"})
                break
            try:
                if line.too_long:
                    raise too_long(s.api.max_batch_line_bytes)
                custom_id, _ = await self._check_line(h, line.data)
                if not await self.r.sadd(seen, custom_id):
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
                await self._keep_lease(batch_id)
        await self.r.delete(seen)
        if bad > len(errors):
            errors.append({"code": "too_many_errors", "param": None, "line": None,
                           "message": f"{bad} lines have errors; the first "
                                      f"{MAX_REPORTED_ERRORS} are listed"})
        if total == 0:
            errors.append({"code": "empty_file", "message": "the input file has no lines",
                           "param": None, "line": None})
        now = repr(time.time())
        if errors:
            fields = {"status": "failed", "failed_at": now,
                      "errors": dumps({"object": "list", "data": errors})}
            status = "failed"
        else:
            fields = {"status": "in_progress", "in_progress_at": now, "total": str(total)}
            status = "in_progress"
        if await self.r.hget(keys.batch(batch_id), "status") == "cancelling":
            # cancelled while validating: nothing was enqueued, the sweep settles it
            fields, status = {"total": str(total), "enqueue_done": "1"}, "cancelling"
        await self.r.hset(keys.batch(batch_id), mapping=fields)  # type: ignore[arg-type]
        log.info("batch %s: %d lines, %d errors -> %s", batch_id, total, len(errors), status)
        return status

    async def enqueue(self, h: dict[str, str]) -> None:
        """Lines after the cursor, a chunk per round trip (AsyncJobStore.create_many); the
        cursor, saved after each chunk, only passes lines that were written."""
        s, batch_id = self.state.settings, h["id"]
        cursor = int(h.get("cursor", 0))
        size = max(1, min(s.api.batch_chunk, MAX_PIPELINE))
        chunk: list[tuple[int, NewJob | NewRejection]] = []
        async for line in self._lines(h):
            if line.n <= cursor:
                continue
            chunk.append((line.n, await self._line(h, line)))
            if len(chunk) < size:
                continue
            cursor, refused = await self._write(batch_id, chunk, cursor)
            chunk = []
            await self.r.hset(keys.batch(batch_id), "cursor", str(cursor))
            if refused:
                return
            await self._keep_lease(batch_id)
            if await self.r.hget(keys.batch(batch_id), "status") != "in_progress":
                break  # cancelled: stop enqueuing; the sweep follows
        cursor, refused = await self._write(batch_id, chunk, cursor)
        if refused:
            await self.r.hset(keys.batch(batch_id), "cursor", str(cursor))
            return
        await self.r.hset(keys.batch(batch_id), mapping={"cursor": str(cursor),
                                                         "enqueue_done": "1"})

    async def _write(self, batch_id: str, chunk: list[tuple[int, NewJob | NewRejection]],
                     cursor: int) -> tuple[int, bool]:
        """The chunk's lines, written: the new cursor (the last line before the first
        refused one) and whether one was refused (queue full: continue later). One round
        trip creates the chunk's jobs; the rejections before the first refusal follow in a
        second, only when there are any (a line valid at validation failing now is rare),
        so no line after a refusal is rejected early. CREATE skips an id that exists, so a
        line after the refusal that was created anyway (the queue drained between the
        pipelined scripts) is not counted twice when it is sent again."""
        jobs = [(n, x) for n, x in chunk if isinstance(x, NewJob)]
        results: list[Any] | None = None
        try:
            results = await self.state.jobs.create_many([x for _, x in jobs])
        finally:  # placed lines not created are counted in their pool no longer
            made: list[Any] = results if results is not None else [None] * len(jobs)
            for (_, x), got in zip(jobs, made, strict=True):
                if x.fields.get("pool") and not isinstance(got, Created):
                    with contextlib.suppress(RedisError):
                        await asyncio.shield(placement.release(self.state, x.fields["pool"]))
        refusal = next((n for (n, _), got in zip(jobs, results, strict=True)
                        if isinstance(got, QueueFull | TenantFull)), None)
        done = [(n, x) for n, x in chunk if refusal is None or n < refusal]
        await self.state.jobs.create_many([x for _, x in done if isinstance(x, NewRejection)])
        if refusal is not None:
            log.info("batch %s: queue full at line %d; continuing later", batch_id, refusal)
        return (done[-1][0] if done else cursor), refusal is not None

    def _lines(self, h: dict[str, str]) -> AsyncIterator[jsonl.Line]:
        return jsonl.lines(files.iter_bytes(self.state, h["input_file_id"]),
                           self.state.settings.api.max_batch_line_bytes)

    async def _line(self, h: dict[str, str], line: jsonl.Line) -> NewJob | NewRejection:
        """A line as the store writes it: its job, or its rejection."""
        # Checked (and tokenised) a second time on purpose: keeping the validation pass's
        # results would hold every line in memory, which is what this driver avoids.
        n, raw = line.n, line.data
        try:
            if line.too_long:
                raise too_long(self.state.settings.api.max_batch_line_bytes)
            custom_id, p = await self._check_line(h, raw)
            await service.place(self.state, p)
        except RedisError:
            raise
        except Exception as exc:  # valid at validation, not now: that line fails alone
            cid = _custom_id(raw) if len(raw) <= INLINE_LINE_BYTES else \
                await self.state.counter.pool.run(h["owner"], _custom_id, raw)
            return self.rejection(h, n, cid, exc)
        extra = {"endpoint": h["endpoint"], "batch": h["id"], "custom_id": custom_id,
                 "ttl": str(self.state.settings.api.file_ttl_s)}
        job = service.new_job(self.state, h["owner"], p, job_id=line_job_id(h["id"], n),
                              deadline=float(h["expires_at"]), extra=extra)
        return replace(job, queue_limit=batch_lane_limit(self.state.settings.api.queue_limit))

    def rejection(self, h: dict[str, str], n: int, custom_id: str,
                  exc: Exception) -> NewRejection:
        """Line `n` ends `failed` without running: a line of the batch's error file (OpenAI's
        shape, status 400) and one more in its `failed` count."""
        err = exc if isinstance(exc, LineError) else LineError(
            "invalid_request", f"the line could not be processed ({type(exc).__name__})")
        log.warning("batch %s line %d: rejected at enqueue: %s", h["id"], n, err.message)
        job_id = line_job_id(h["id"], n)
        now = time.time()
        fields = {"id": job_id, "owner": h["owner"], "model": "", "backend": "",
                  "priority": "low", "state": "queued", "attempts": "0",
                  "created_at": repr(now), "request": "{}", "endpoint": h["endpoint"],
                  "batch": h["id"], "custom_id": custom_id,
                  "ttl": str(self.state.settings.api.file_ttl_s)}
        return NewRejection(job_id, fields, h["owner"],
                            JobErrorInfo(code=err.code, message=err.message),
                            self.state.settings.api.file_ttl_s, now)

    async def sweep_cancel(self, batch_id: str) -> None:
        """Queued lines end `cancelled` (counted by the job scripts); running ones finish
        (the cancel script checks the state and ends a queued line in one step, so a line
        leased meanwhile is left running), and the last of them to end settles the batch
        `cancelled` (shared/lua/terminal.lua), its result in the output file. No line
        past the cursor is enqueued once `enqueue_done` is set."""
        s = self.state.settings
        await self.r.hset(keys.batch(batch_id), "enqueue_done", "1")
        cursor, total = await self.r.hmget(keys.batch(batch_id), ["cursor", "total"])
        # Lines just past the cursor may exist: written after a refused line of their chunk
        # (AsyncJobStore.create_many), or by a driver that died before saving the cursor.
        last = max(int(cursor or 0), min(int(cursor or 0) + MAX_PIPELINE, int(total or 0)))
        for n in range(1, last + 1):
            await self.state.jobs.cancel(line_job_id(batch_id, n), ttl=s.api.file_ttl_s,
                                         queued_only=True)
            if n % s.api.batch_chunk == 0:
                await self._keep_lease(batch_id)
        await self.r.hset(keys.batch(batch_id), "swept", "1")
