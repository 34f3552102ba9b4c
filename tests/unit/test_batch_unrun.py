"""The lines a cancel left unenqueued (shared/lua/batch_unrun.lua): entries of the batch's
error file, counted once however many sweeps run, and rendered as the `batch_cancelled`
lines a cancelled record gave (api/openai/batch_files.py)."""

from __future__ import annotations

import time

import redis

from tokenq.api.openai.batch_files import unrun_line
from tokenq.api.openai.batch_lines import line_job_id
from tokenq.shared import keys
from tokenq.shared.lua_scripts import Scripts

BATCH = "batch_0abc"


def unrun(r: redis.Redis, lines: list[tuple[int, str]]) -> int:
    script = Scripts(r, ("batch_unrun",))["batch_unrun"]
    args: list[str] = [repr(time.time())]
    for n, cid in lines:
        args += [str(n), cid]
    return int(script(keys=[keys.batch(BATCH),
                            *(keys.job(line_job_id(BATCH, n)) for n, _ in lines)], args=args))


def test_unrun_lines_are_counted_once_and_settle_the_batch(r: redis.Redis) -> None:
    r.hset(keys.batch(BATCH), mapping={
        "id": BATCH, "owner": "alpha", "status": "cancelling", "total": "4", "enqueued": "1",
        "completed": "0", "failed": "1", "enqueue_done": "1", "cursor": "1"})
    r.hset(keys.job(line_job_id(BATCH, 2)), "id", line_job_id(BATCH, 2))  # past the cursor
    lines = [(2, "b"), (3, "c c"), (4, "")]
    assert unrun(r, lines) == 2  # line 2 has its job: the job scripts count it
    assert unrun(r, lines) == 0  # a second sweep (another driver) counts none again
    h = r.hgetall(keys.batch(BATCH))
    assert (h["enqueued"], h["failed"], h["status"]) == ("3", "3", "cancelling")
    entries = r.lrange(keys.batch_err(BATCH), 0, -1)
    assert entries == ["~3 c c", "~4 "]
    assert not r.exists(keys.job(line_job_id(BATCH, 3)))  # no record of its own
    assert unrun_line(BATCH, entries[0]) == {
        "id": "batch_req_0abc_3", "custom_id": "c c", "response": None,
        "error": {"code": "batch_cancelled",
                  "message": "the request was cancelled before it ran"}}
    r.hincrby(keys.batch(BATCH), "failed", 1)  # line 2 ends: the last of the four
    r.hincrby(keys.batch(BATCH), "enqueued", 1)
    assert unrun(r, [(4, "")]) == 0
    assert r.hget(keys.batch(BATCH), "status") == "cancelled"
