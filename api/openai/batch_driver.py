"""The batch driver: validates a batch's input file, enqueues its lines, sweeps a cancel.

Every API replica runs one driver task. Batches that need work sit in the
`tokenq:batches:pending` set; a driver takes one with a lease key (SET NX PX)
and renews it between chunks, so a replica that dies mid-batch leaves it to
another within the lease TTL. Work is idempotent: job ids are derived from the
batch id and line number (CREATE skips an id that exists) and the cursor is
saved after each chunk; a chunk's lines are written in one pipelined round trip
(AsyncJobStore.create_many). The input file is read a piece at a time, so a
10,000-line batch never needs 10,000 objects in memory.

A replica drives up to MAX_DRIVEN batches at once, one per tenant: one tenant's 50,000-line
batch (a minute or more of validation) no longer holds every other tenant's batch back.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from tokenq.api import admission, cpu, placement, service
from tokenq.api.deps import AppState
from tokenq.api.errors import TokenqError
from tokenq.api.openai import files, jsonl
from tokenq.api.openai.batch_cancel import sweep
from tokenq.api.openai.batch_lines import (
    INLINE_LINE_BYTES,
    MAX_PIPELINE,
    LineError,
    Source,
    custom_id_of,
    parse_line,
    too_long,
)
from tokenq.api.openai.batch_lines import line_job_id as line_job_id  # (tokenq bench scale)
from tokenq.api.openai.batch_store import BatchStore
from tokenq.api.openai.batch_validate import gone_error, validate
from tokenq.api.openai.embeddings import check_dimensions
from tokenq.shared import aio, keys
from tokenq.shared.jobs import Created, NewJob, NewRejection, QueueFull, TenantFull, dumps
from tokenq.shared.schemas import JobErrorInfo

log = logging.getLogger(__name__)

MAX_DRIVEN = 4  # batches a replica works on at once (one per tenant)
RETRY_S = 1.0  # a batch whose turn left it waiting for room waits this long for its next
MAX_DRIVER_FAILURES = 3  # tries of a batch whose processing raises, then it is given up
BATCH_LANE_SHARE = 0.9  # of a lane's queue_limit, batch lines fill at most (batch_lane_limit)


def batch_lane_limit(queue_limit: int) -> int:
    """How full batch lines may fill a lane (the `low` one they share with every tenant's
    own low-priority jobs): BATCH_LANE_SHARE of its limit, so one tenant's batch cannot
    lock the others out of it (a 12,000-line batch held it at 10,000 and every other
    tenant's `low` job got 429 until it drained). 0: no limit."""
    return max(1, int(queue_limit * BATCH_LANE_SHARE)) if queue_limit > 0 else 0


class BatchDriver:
    def __init__(self, state: AppState):
        self.state = state
        self.r = state.redis
        self.me = uuid.uuid4().hex
        self.wake = asyncio.Event()
        self.batches = BatchStore(self.r, self.me)
        self._stopping = False
        self._driving: dict[str, tuple[str, asyncio.Task[None]]] = {}  # batch: owner, task
        self._resting: dict[str, float] = {}  # batch: its next turn (monotonic)
        self._last = ""  # the batch started last: the next look begins after it

    async def run(self) -> None:
        cpu.PATIENT.set(True)  # lines wait for their tenant's share of the CPU pool, never 429
        try:
            while not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)
                self.wake.clear()
                if self._stopping or self.state.draining:
                    continue
                try:
                    await self.start_more()
                except RedisError as exc:
                    log.warning("batch driver: %s; retrying", exc)
                except Exception:
                    log.exception("batch driver failed; retrying")
        finally:
            for _, task in list(self._driving.values()):
                await aio.cancel_and_wait(task)

    async def start_more(self) -> None:
        """Pending batches this replica is not driving, each in a task of its own, up to
        MAX_DRIVEN and one per tenant (a batch another replica holds is skipped: its
        lease), in turn: the look begins after the batch started last, and a batch whose
        turn left it waiting for room in its lane sits out RETRY_S (a cancel's `nudge`
        ends that). (Taken in id order every time, batches stuck on a full lane, a few
        milliseconds a turn, held every slot, and their tenants' other batches.)"""
        pending, now = await self.batches.pending(), time.monotonic()
        self._resting = {b: t for b, t in self._resting.items() if t > now}
        k = bisect.bisect_right(pending, self._last)
        for batch_id in pending[k:] + pending[:k]:
            if len(self._driving) >= MAX_DRIVEN:
                return
            if batch_id in self._driving or batch_id in self._resting:
                continue
            owner = str(await self.r.hget(keys.batch(batch_id), "owner") or "")
            if owner and any(o == owner for o, _ in self._driving.values()):
                continue
            if await self.batches.take_lease(batch_id):
                task = asyncio.create_task(self.drive(batch_id), name=f"tokenq-{batch_id}")
                self._driving[batch_id] = (owner, task)
                self._last = batch_id

    async def drive(self, batch_id: str) -> None:
        waiting = False
        try:
            waiting = await self.work_isolated(batch_id)
        except RedisError as exc:
            log.warning("batch %s: %s; retrying", batch_id, exc)
        except Exception:
            log.exception("batch %s: driver failed; retrying", batch_id)
        finally:
            self._driving.pop(batch_id, None)
            if waiting:  # for room in its lane: not again at once
                self._resting[batch_id] = time.monotonic() + RETRY_S
            self.wake.set()  # its slot is free: the next batch's turn
            with contextlib.suppress(RedisError):
                await self.batches.drop_lease(batch_id)

    def nudge(self, batch_id: str) -> None:
        """The batch needs its driver now (a cancel): no resting."""
        self._resting.pop(batch_id, None)
        self.wake.set()

    async def work_isolated(self, batch_id: str) -> bool:
        """`work`, where a batch that raises harms only itself: the next batches go on, and
        after MAX_DRIVER_FAILURES tries it is given up (`failed`, or no more lines enqueued)
        rather than retried every second for ever. A Redis error is nobody's fault: it is
        raised, and every batch is tried again when Redis is back. Whether the batch waits
        for room in its lane."""
        try:
            return await self.work(batch_id)
        except RedisError:
            raise
        except Exception as exc:
            n = int(await self.r.hincrby(keys.batch(batch_id), "driver_failures", 1))
            log.exception("batch %s: processing failed (%d of %d tries)", batch_id, n,
                          MAX_DRIVER_FAILURES)
            if n >= MAX_DRIVER_FAILURES:
                await self.give_up(batch_id, exc)
            return False

    async def give_up(self, batch_id: str, exc: Exception) -> None:
        error = {"code": "batch_processing_failed", "param": None, "line": None,
                 "message": f"the batch could not be processed ({type(exc).__name__}) after "
                            f"{MAX_DRIVER_FAILURES} tries; lines not yet enqueued were not run"}
        status = await self.stop_early(batch_id, error, swept=True)
        if await self.batches.settle(batch_id) != "validating":
            await self.batches.release(batch_id)
        log.error("batch %s: given up (%s)", batch_id, status)

    async def stop_early(self, batch_id: str, error: dict[str, Any], *,
                         swept: bool = False) -> str | None:
        """No more lines are enqueued (`error` says why, in the batch's `errors`): its total
        becomes the lines it enqueued, every one counted when it ends (the rest never
        became requests), and a batch that enqueued none fails. Its status before."""
        bk = keys.batch(batch_id)
        status, enqueued = await self.r.hmget(bk, ["status", "enqueued"])
        n, status = int(enqueued or 0), str(status) if status else None
        fields = {"errors": dumps({"object": "list", "data": [error]}), "enqueue_done": "1",
                  "total": str(n)}
        if swept:
            fields["swept"] = "1"
        failed = status == "validating" or (status == "in_progress" and not n)
        if failed:
            fields.update(status="failed", failed_at=repr(time.time()))
        await self.r.hset(bk, mapping=fields)  # type: ignore[arg-type]
        if failed:
            await self.expire_failed(bk)
        return status

    async def expire_failed(self, bk: str) -> None:
        """A batch that failed with no line run lives as long as a settled one
        (terminal.lua, expire_batch): `file_ttl` from now."""
        ttl = await self.r.hget(bk, "file_ttl")
        if ttl:
            await self.r.expire(bk, int(ttl))

    def stop(self) -> None:
        self._stopping = True
        self.wake.set()

    async def keep_lease(self, batch_id: str) -> None:
        if not await self.batches.renew_lease(batch_id):
            raise RuntimeError(f"lost the driver lease of {batch_id}")

    async def work(self, batch_id: str) -> bool:
        """The batch's turn: whether it waits for room in its lane after it."""
        h: dict[str, str] = await self.r.hgetall(keys.batch(batch_id))  # type: ignore[assignment]
        if not h:
            await self.r.srem(keys.BATCHES_PENDING, batch_id)
            return False
        waiting = False
        if h["status"] == "validating":
            h["status"] = await self.validate(h)
        if h["status"] == "in_progress" and h.get("enqueue_done") != "1":
            waiting = await self.enqueue(h)
        if await self.r.hget(keys.batch(batch_id), "status") == "cancelling":
            await self.sweep_cancel(batch_id)
            waiting = False
        if await self.batches.settle(batch_id) != "validating":
            await self.batches.release(batch_id)
        return waiting

    async def check_line(self, h: dict[str, str], raw: bytes) -> tuple[str, admission.Prepared]:
        """A line's custom_id and its prepared job; a long line is parsed on the CPU pool in
        the batch owner's share (waiting for it: the driver is not refused)."""
        try:
            if len(raw) <= INLINE_LINE_BYTES:
                line = parse_line(h["endpoint"], raw)
            else:
                line = await self.state.counter.pool.run(
                    h["owner"], parse_line, h["endpoint"], raw)
            if line.dimensions is not None:
                await check_dimensions(self.state, line.job.model, line.dimensions)
            p = await admission.prepare(self.state, h["owner"], line.job)
            p.fields.update(line.fields)
            return line.custom_id, p
        except ValidationError as exc:
            e = exc.errors()[0]
            param = ".".join(str(p) for p in e.get("loc", ()))
            raise LineError("invalid_request", f"{param or 'body'}: {e.get('msg')}",
                            f"body.{param}" if param else "body") from exc
        except TokenqError as exc:
            raise LineError(exc.code or "invalid_request", exc.message,
                            f"body.{exc.param}" if exc.param else None) from exc

    async def validate(self, h: dict[str, str]) -> str:
        """Check every line (api/openai/batch_validate.py)."""
        return await validate(self, h)

    async def enqueue(self, h: dict[str, str]) -> bool:
        """Lines after the cursor, a chunk per round trip (AsyncJobStore.create_many); the
        cursor, saved after each chunk, only passes lines that were written. Whether a
        line was refused (its lane full: the rest wait for room)."""
        s, batch_id = self.state.settings, h["id"]
        cursor = int(h.get("cursor", 0))
        size = max(1, min(s.api.batch_chunk, MAX_PIPELINE))
        chunk: list[tuple[int, NewJob | NewRejection]] = []
        source = Source()
        async for line in self.lines(h, source):
            if source.gone:
                break  # deleted: this last line may be cut short; the lines before are whole
            if line.n <= cursor:
                continue
            chunk.append((line.n, await self._line(h, line)))
            if len(chunk) < size:
                continue
            cursor, refused = await self._write(batch_id, chunk, cursor)
            chunk = []
            await self.r.hset(keys.batch(batch_id), "cursor", str(cursor))
            if refused:
                return True
            await self.keep_lease(batch_id)
            if await self.r.hget(keys.batch(batch_id), "status") != "in_progress":
                break  # cancelled: stop enqueuing; the sweep follows
        cursor, refused = await self._write(batch_id, chunk, cursor)
        if refused:
            await self.r.hset(keys.batch(batch_id), "cursor", str(cursor))
            return True
        await self.r.hset(keys.batch(batch_id), "cursor", str(cursor))
        enqueued, total = (int(x or 0) for x in await self.r.hmget(
            keys.batch(batch_id), ["enqueued", "total"]))
        if source.gone and enqueued < total:
            await self.stop_early(batch_id, gone_error(h, enqueued))
            log.warning("batch %s: input file gone after %d lines", batch_id, enqueued)
        else:
            await self.r.hset(keys.batch(batch_id), "enqueue_done", "1")
        return False

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

    def lines(self, h: dict[str, str], source: Source) -> AsyncIterator[jsonl.Line]:
        return jsonl.lines(self._pieces(h, source), self.state.settings.api.max_batch_line_bytes)

    async def _pieces(self, h: dict[str, str], source: Source) -> AsyncIterator[bytes]:
        try:
            async for piece in files.iter_whole(self.state, h["input_file_id"]):
                yield piece
        except files.FileGone:
            source.gone = True

    async def _line(self, h: dict[str, str], line: jsonl.Line) -> NewJob | NewRejection:
        """A line as the store writes it: its job, or its rejection."""
        # Checked (and tokenised) a second time on purpose: keeping the validation pass's
        # results would hold every line in memory, which is what this driver avoids.
        n, raw = line.n, line.data
        try:
            if line.too_long:
                raise too_long(self.state.settings.api.max_batch_line_bytes)
            custom_id, p = await self.check_line(h, raw)
            await service.place(self.state, p)
        except RedisError:
            raise
        except Exception as exc:  # valid at validation, not now: that line fails alone
            cid = custom_id_of(raw) if len(raw) <= INLINE_LINE_BYTES else \
                await self.state.counter.pool.run(h["owner"], custom_id_of, raw)
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
        """A cancel's sweep (api/openai/batch_cancel.py)."""
        await sweep(self, batch_id)
