"""A batch whose queue fills mid-chunk: the driver writes a chunk of lines in one round trip
(AsyncJobStore.create_many), and the line outcomes are those of one line at a time: the
lines before the refused one are created or rejected, the refused line and every line
after it are left for later (none rejected early), the cursor stops before the refused
line, and a cancel settles the batch with each line counted once (the lines never written
end `cancelled` without running)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from tests.faults.harness import FAKE, FAKE_IDLE, fake_stack, redis_of
from tests.faults.test_batch_cancel import wait_for
from tests.faults.test_hostile_batches import client, create, inject_batch, wait_done
from tests.integration.test_openai_batches import chat_line, jsonl
from tokenq.api.openai.batch_driver import batch_lane_limit
from tokenq.cli.stack import Stack
from tokenq.shared import keys

LIMIT = 4  # what batch lines may fill: 90% of the queue limit (batch_lane_limit)
# line n: True a valid line (its queue has no worker), False one whose model is gone
LINES = [True, False, True, True, True, True, False, True]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": "key-alpha:alpha,key-beta:beta",
           "TOKENQ_API__QUEUE_LIMIT": "5"}
    with fake_stack(tmp_path_factory.mktemp("batch-queue-full"), workers=1, env=env) as st:
        yield st


def wait_field(r: redis.Redis, key: str, field: str, value: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while r.hget(key, field) != value:
        assert time.monotonic() < deadline, r.hgetall(key)
        time.sleep(0.2)


def test_queue_full_mid_chunk_keeps_line_outcomes(stack: Stack) -> None:
    r = redis_of(stack)
    alpha = client(stack, "alpha")
    lines = [chat_line(f"l{n}", "hi", model=FAKE_IDLE if ok else "no-such-model")
             for n, ok in enumerate(LINES, 1)]
    f = alpha.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    bid = "batch_0002"
    inject_batch(r, bid, f.id, total=str(len(LINES)))
    bk = keys.batch(bid)
    # lines 1, 3, 4, 5 fill the queue (LIMIT 4), line 2 is rejected; line 6 is refused
    wait_field(r, bk, "cursor", "5")
    assert states(r, bid) == {1: "queued", 2: "failed", 3: "queued", 4: "queued", 5: "queued",
                   6: None, 7: None, 8: None}
    assert r.hget(bk, "enqueued") == "5"
    assert r.hget(bk, "enqueue_done") is None
    assert r.llen(keys.queue(FAKE_IDLE, "low")) == LIMIT
    # cancelled while it waits for room: the queued lines end cancelled (counted failed, as
    # OpenAI's request_counts do), and so do the lines never written (without running, and
    # without a job record: entries of the error file; every line of the total is counted,
    # api/openai/batch_cancel.py); the batch settles
    alpha.batches.cancel(bid)
    b = wait_done(alpha, bid)
    assert b.status == "cancelled", b
    assert b.request_counts is not None, b
    assert (b.request_counts.total, b.request_counts.completed,
            b.request_counts.failed) == (8, 0, 8), b
    assert states(r, bid) == {1: "cancelled", 2: "failed", 3: "cancelled", 4: "cancelled",
                              5: "cancelled", 6: None, 7: None, 8: None}
    assert r.hget(bk, "enqueued") == "8"
    errs = [json.loads(x) for x in alpha.files.content(b.error_file_id or "").text.splitlines()]
    assert [x["custom_id"] for x in errs if x["error"]] == ["l1", "l3", "l4", "l5", "l6", "l7",
                                                           "l8"], errs
    r.close()


def states(r: redis.Redis, batch_id: str) -> dict[int, str | None]:
    n = batch_id.removeprefix("batch_")
    return {i: r.hget(keys.job(f"job_{n}_{i}"), "state")  # type: ignore[misc]
            for i in range(1, len(LINES) + 1)}


def test_the_limit_here_is_what_batch_lines_may_fill() -> None:
    assert batch_lane_limit(5) == LIMIT


def test_a_cancel_names_every_unenqueued_line_when_later_lines_have_jobs(stack: Stack) -> None:
    """Lines past the cursor can have jobs (another model's lines of the refused chunk).
    The cancel's sweep stopped reading the file once it had read as many lines as were
    missing, counting those jobs among them, and named the rest "" though the file was
    there."""
    r = redis_of(stack)
    alpha = client(stack, "alpha")
    models = [FAKE_IDLE] * 5 + [FAKE] * 3 + [FAKE_IDLE] * 4  # the idle lane fills at LIMIT
    cids = [f"x{n}" for n in range(1, len(models) + 1)]
    bid = create(alpha, [chat_line(c, "hi", model=m) for c, m in zip(cids, models,
                                                                       strict=True)])
    job = f"job_{bid.removeprefix('batch_')}"
    wait_for("the other model's lines past the refused one have jobs",
             lambda: all(r.exists(keys.job(f"{job}_{n}")) for n in (6, 7, 8)))
    alpha.batches.cancel(bid)
    b = wait_done(alpha, bid)
    assert b.status == "cancelled" and b.request_counts is not None, b
    named: list[str] = []
    for file_id in (b.output_file_id, b.error_file_id):
        if file_id:
            named += [json.loads(x)["custom_id"]
                      for x in alpha.files.content(file_id).text.splitlines()]
    assert sorted(named) == sorted(cids), named
