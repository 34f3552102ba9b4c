"""Cancelling a batch ends its queued lines and lets its running ones finish (OpenAI's Batch
API: the batch stays `cancelling` while in-flight requests finish, and their results are in
the output file). The sweep used to cancel every line up to the cursor, running ones
included: they were cut off mid-generation and ended in the error file as
`batch_cancelled`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import openai
import pytest
import redis
import redis.asyncio as aioredis

from tests.faults.harness import FAKE, fake_stack, redis_of
from tests.faults.test_hostile_batches import client, create
from tests.integration.test_job_state import JOB, SETTINGS, acquire, attempt_of, events, finish
from tests.integration.test_job_state import create as create_job
from tests.integration.test_openai_batches import chat_line
from tokenq.cli.stack import Stack
from tokenq.shared import keys
from tokenq.shared.jobs import Cancelled
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import TERMINAL_STATES
from tokenq.shared.store import AsyncJobStore
from tokenq.workers.engines.fake import expected_output

SLOTS, LINES = 2, 6  # one worker with 2 slots: 2 lines run, 4 wait
TOKENS, RATE = 60, 10.0  # a line runs 6 s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": "key-alpha:alpha,key-beta:beta"}
    with fake_stack(tmp_path_factory.mktemp("batch-cancel"), workers=1, slots=SLOTS,
                    rate=RATE, env=env) as st:
        yield st


def snapshot(r: redis.Redis, batch_id: str) -> tuple[str, dict[int, str | None]]:
    """The batch's status and each line's state, read in one MULTI (one moment)."""
    hex_ = batch_id.removeprefix("batch_")
    pipe = r.pipeline(transaction=True)
    pipe.hget(keys.batch(batch_id), "status")
    for n in range(1, LINES + 1):
        pipe.hget(keys.job(f"job_{hex_}_{n}"), "state")
    status, *st = pipe.execute()
    return status, dict(enumerate(st, 1))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def read_lines(oai: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, object]]:
    assert file_id
    lines = [json.loads(x) for x in oai.files.content(file_id).text.splitlines() if x]
    return {x["custom_id"]: x for x in lines}


def test_cancel_lets_running_lines_finish_and_ends_queued_ones(stack: Stack) -> None:
    r = redis_of(stack)
    alpha = client(stack, "alpha")
    bid = create(alpha, [chat_line(f"l{n}", "go", model=FAKE, max_tokens=TOKENS)
                         for n in range(1, LINES + 1)])
    wait_for("2 lines running, 4 queued", lambda: sorted(
        str(s) for s in snapshot(r, bid)[1].values()) == ["queued"] * 4 + ["running"] * 2)
    _, before = snapshot(r, bid)
    running = {n for n, s in before.items() if s == "running"}
    queued = {n for n, s in before.items() if s == "queued"}
    assert alpha.batches.cancel(bid).status == "cancelling"

    seen_cancelling_while_running = False
    deadline = time.monotonic() + 60
    while True:
        status, st = snapshot(r, bid)
        if status == "cancelled":
            # settled only once its last running line ended
            assert all(st[n] in TERMINAL_STATES for n in running), st
            break
        assert status == "cancelling", status
        if all(st[n] == "cancelled" for n in queued) and any(
                st[n] == "running" for n in running):
            seen_cancelling_while_running = True
        assert time.monotonic() < deadline, (status, st)
        time.sleep(0.1)
    # the running lines finished whole (not cut off); the queued ones never ran
    assert {n: st[n] for n in running} == dict.fromkeys(running, "succeeded"), st
    assert {n: st[n] for n in queued} == dict.fromkeys(queued, "cancelled"), st
    assert seen_cancelling_while_running, "the running lines ended before the sweep"

    b = alpha.batches.retrieve(bid)
    assert b.status == "cancelled" and b.request_counts is not None
    counts = b.request_counts
    assert (counts.total, counts.completed, counts.failed) == (LINES, len(running),
                                                               len(queued)), counts
    out = read_lines(alpha, b.output_file_id)
    assert set(out) == {f"l{n}" for n in running}
    for x in out.values():
        resp = x["response"]
        assert isinstance(resp, dict) and resp["status_code"] == 200, x
        choice = resp["body"]["choices"][0]
        assert choice["message"]["content"] == expected_output(TOKENS), x
        assert choice["finish_reason"] == "length", x
    errs = read_lines(alpha, b.error_file_id)
    assert set(errs) == {f"l{n}" for n in queued}
    for x in errs.values():
        assert x["error"] == {"code": "batch_cancelled",
                              "message": "the request was cancelled before it ran"}, x
    hex_ = bid.removeprefix("batch_")
    finished = max(float(r.hget(keys.job(f"job_{hex_}_{n}"), "finished_at") or 0)
                   for n in running)
    assert float(r.hget(keys.batch(bid), "cancelled_at") or 0) >= finished
    r.close()


def test_cancel_queued_only_ends_a_queued_job_and_leaves_a_running_one(
        redis_server: EmbeddedRedis, r: redis.Redis) -> None:
    """The store's conditional cancel (the batch sweep's): the state is checked and a queued
    job ended in one script, so a job leased just before is left running, never asked to
    stop, and finishes as usual."""
    async def cancel() -> Cancelled:
        ar = aioredis.Redis(port=redis_server.port, db=15, decode_responses=True)
        try:
            return await AsyncJobStore(ar, SETTINGS).cancel(JOB, queued_only=True)
        finally:
            await ar.aclose()

    create_job(r)
    assert asyncio.run(cancel()) is Cancelled.CANCELLED
    assert events(r) == ["queued", "cancelled"]
    r.flushdb()
    create_job(r)
    attempt = attempt_of(acquire(r))
    assert asyncio.run(cancel()) is Cancelled.LEFT
    assert r.hget(keys.job(JOB), "state") == "running"
    assert r.hget(keys.job(JOB), "cancel_requested") is None
    assert events(r) == ["queued", "started"]
    assert finish(r, attempt)
    assert r.hget(keys.job(JOB), "state") == "succeeded"
    assert asyncio.run(cancel()) is Cancelled.ENDED
