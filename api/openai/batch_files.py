"""A finished batch's output and error files: registered as file objects, rendered on read.

The files are not stored. `batch_settle` (shared/lua/terminal.lua) registers them once,
when the batch settles, so the ids a finished batch shows resolve on every route (files
retrieve, content, list) whichever route showed them; a file deleted afterwards stays
deleted (404) while the batch keeps showing its id, as OpenAI's does. Their lines are
rendered from the job records (`:out`, `:err` hold the job ids; an `:err` entry "~<line>
<custom_id>" is a line a cancel left unenqueued, with no record) a chunk at a time; the
size, which rendering alone can tell, is measured on the first read of the file object
and kept in it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import WatchError

from tokenq.api.cpu import PATIENT
from tokenq.api.deps import AppState
from tokenq.api.openai import embeddings
from tokenq.api.openai.batch_lines import line_job_id
from tokenq.api.openai.batch_store import BatchStore
from tokenq.api.openai.protocol import EmbeddingsEndpoint, final_response
from tokenq.api.openai.tools import Plan, from_compact
from tokenq.shared import keys
from tokenq.shared.jobs import dumps
from tokenq.shared.schemas import JobRecord

TERMINAL = ("completed", "failed", "expired", "cancelled")


async def ensure_registered(state: AppState, h: dict[str, str]) -> None:
    """A finished batch settled without registering its files (a hash without `files_key`:
    an older API's) registers them now, once (shared/lua/batch_files.lua)."""
    if h["status"] not in TERMINAL or h.get("files_at") or h.get("files_key"):
        return
    await BatchStore(state.redis, "").register_files(
        h["id"], keys.tenant_files(h["owner"]), state.settings.api.file_ttl_s)
    h["files_at"] = "1"


async def with_size(state: AppState, h: dict[str, str]) -> dict[str, str]:
    """The file's hash with its `bytes`: an output or error file's is measured (rendered
    once) and kept in its hash, unless the file was deleted meanwhile."""
    if h.get("kind", "upload") == "upload" or "bytes" in h:
        return h
    size = 0
    async for piece in render(state, h):
        size += len(piece)
    key = keys.file(h["id"])
    async with state.redis.pipeline(transaction=True) as pipe:
        await pipe.watch(key)
        if await pipe.exists(key):  # never write into a deleted file's key: it would return
            pipe.multi()  # type: ignore[no-untyped-call]
            pipe.hset(key, "bytes", str(size))
            try:
                await pipe.execute()
            except WatchError:
                pass  # deleted (or measured) meanwhile
    return {**h, "bytes": str(size)}


def ended_unrun(status: str, *, started: bool) -> dict[str, str]:
    """The `error` of a line cancelled or expired (before it ran, unless `started`)."""
    code = "batch_cancelled" if status == "cancelled" else "batch_expired"
    return {"code": code, "message": f"the request was {status}"
            + ("" if started else " before it ran")}


def line_text(endpoint: str, rec: JobRecord, custom_id: str, plan: Plan | None = None,
              encoding: str = "float") -> str:
    """`output_line` as JSON text; a succeeded embeddings line's body is encoded a vector
    at a time (embeddings.body_json), not in one call that holds the GIL."""
    if endpoint != EmbeddingsEndpoint or rec.status != "succeeded":
        return dumps(output_line(endpoint, rec, custom_id, plan))
    head = dumps({"id": "batch_req_" + rec.id.removeprefix("job_"), "custom_id": custom_id,
                  "response": {"status_code": 200, "request_id": rec.id}})
    body = embeddings.body_json(rec, rec.adapter or rec.model, encoding)
    return f'{head[:-2]},"body":{body}}},"error":null}}'


def output_line(endpoint: str, rec: JobRecord, custom_id: str, plan: Plan | None = None
                ) -> dict[str, Any]:
    """One line of an output or error file, in OpenAI's batch output format (`plan`: the
    line's tool handling, which its record keeps); an embeddings line's: `line_text`."""
    line: dict[str, Any] = {"id": "batch_req_" + rec.id.removeprefix("job_"),
                            "custom_id": custom_id, "response": None, "error": None}
    if rec.status == "succeeded":
        line["response"] = {"status_code": 200, "request_id": rec.id,
                            "body": final_response(endpoint, rec, None, plan)}
    elif rec.status in ("cancelled", "expired"):
        line["error"] = ended_unrun(rec.status, started=rec.started_at is not None)
    else:
        err = rec.error
        # Refused before it ran (a line rejected at enqueue: attempts 0) or by the engine
        # for the request itself: the client's error; anything else: the server's.
        status = 400 if err is not None and (rec.attempts == 0 or err.code in (
            "context_length_exceeded", "bad_request")) else 500
        line["response"] = {"status_code": status, "request_id": rec.id, "body": {"error": {
            "message": err.message if err else "failed", "type": "server_error"
            if status == 500 else "invalid_request_error", "code": err.code if err else None,
            "param": None}}}
    return line


# What an output line needs of a job record: not its `request` or `spec`, which hold the
# prompt (twice) and the tools; `tool_plan` is what reading the calls back needs of them.
LINE_FIELDS = ("id", "model", "state", "attempts", "created_at", "started_at", "output",
               "finish_reason", "usage", "error", "adapter", "tool_format", "tool_plan",
               "custom_id", "encoding")
# A chunk whose records are larger than this is rendered on the CPU pool, in the batch
# owner's share: reading tool calls back out of 256 long outputs is Python work by the
# character, which on the event loop would stall every stream of the replica.
INLINE_CHUNK_BYTES = 256 * 1024


async def render(state: AppState, file_meta: dict[str, str], chunk: int = 256
                 ) -> AsyncIterator[bytes]:
    """A batch output/error file's JSONL, rendered from job records a chunk at a time."""
    h: dict[str, str] = await state.redis.hgetall(  # type: ignore[assignment]
        keys.batch(file_meta["batch"]))
    key = (keys.batch_out if file_meta["kind"] == "batch_completed" else keys.batch_err)(
        file_meta["batch"])
    start = 0
    while True:
        ids: list[str] = await state.redis.lrange(  # type: ignore[assignment]
            key, start, start + chunk - 1)
        if not ids:
            return
        start += len(ids)
        recs = await _records(state, [x for x in ids if not x.startswith("~")])
        if sum(len(v) for r in recs if r for v in r.values()) <= INLINE_CHUNK_BYTES:
            yield _lines(h, ids, recs)
        else:
            yield await _off_loop(state, h, ids, recs)


async def _records(state: AppState, ids: list[str]) -> list[dict[str, str] | None]:
    """The records' LINE_FIELDS (None: gone)."""
    pipe = state.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), LINE_FIELDS)
    return [{k: v for k, v in zip(LINE_FIELDS, vals, strict=True) if v is not None} or None
            for vals in await pipe.execute()]


async def _off_loop(state: AppState, h: dict[str, str], ids: list[str],
                    recs: list[dict[str, str] | None]) -> bytes:
    """_lines on the CPU pool in the batch owner's share; a download waits its turn there
    (no 429 in the middle of a file)."""
    token = PATIENT.set(True)
    try:
        return await state.counter.pool.run(h["owner"], _lines, h, ids, recs)
    finally:
        PATIENT.reset(token)


def _lines(h: dict[str, str], ids: list[str], recs: list[dict[str, str] | None]) -> bytes:
    """A chunk's lines: `ids` (an entry "~..." is a line a cancel left unenqueued) with the
    records read for the others, in order."""
    found = iter(recs)
    lines = []
    for job_id in ids:
        if job_id.startswith("~"):
            lines.append(dumps(unrun_line(h["id"], job_id)) + "\n")
        elif rec_h := next(found):
            rec = JobRecord.from_hash({"request": "{}", **rec_h})
            lines.append(line_text(h["endpoint"], rec, rec_h.get("custom_id", ""),
                                   from_compact(rec_h.get("tool_plan")),
                                   rec_h.get("encoding", "float")) + "\n")
    return "".join(lines).encode()


def unrun_line(batch_id: str, entry: str) -> dict[str, Any]:
    """The error file's line of a line a cancel left unenqueued: its entry "~<line>
    <custom_id>" (shared/lua/batch_unrun.lua), as a cancelled record before it ran gives."""
    n, _, custom_id = entry[1:].partition(" ")
    job_id = line_job_id(batch_id, int(n))
    return {"id": "batch_req_" + job_id.removeprefix("job_"), "custom_id": custom_id,
            "response": None, "error": ended_unrun("cancelled", started=False)}
