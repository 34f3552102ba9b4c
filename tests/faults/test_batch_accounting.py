"""An outside tester's Batch API findings (through the official SDK): a finished batch
counts every line of its total (completed + failed = total), however it ended (the input
file deleted under it, a cancel while it was validating), and the files it hands out
resolve on every route, once, with their real size; lists refuse an unknown `after`.

Races the tester hit by timing (a delete or a cancel between validation and enqueue) are
injected as the batch record the driver finds at that moment (inject_batch), so each runs
every time; the SDK sequence the tester ran follows, where its outcome can be checked
whichever way the race goes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE, fake_stack, redis_of
from tests.faults.test_hostile_batches import client, create, inject_batch, wait_done
from tests.integration.test_openai_batches import chat_line, jsonl
from tokenq.cli.stack import Stack
from tokenq.shared import keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
LINES = [chat_line(f"c{n}", "hi", model=FAKE) for n in range(1, 4)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta"}
    with fake_stack(tmp_path_factory.mktemp("batch-accounting"), workers=1, env=env) as st:
        yield st


def counts(b: Any) -> tuple[int, int, int]:
    c = b.request_counts
    return c.total, c.completed, c.failed


def add_up(b: Any) -> None:
    total, completed, failed = counts(b)
    assert completed + failed == total, b


def read_lines(oai: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    assert file_id
    lines = [json.loads(x) for x in oai.files.content(file_id).text.splitlines() if x]
    return {x["custom_id"]: x for x in lines}


def test_an_input_file_deleted_before_its_lines_run_fails_the_batch(stack: Stack) -> None:
    r, alpha = redis_of(stack), client(stack, "alpha")
    # deleted after validation (total 3), before enqueue: was `completed` 0 + 0 of 3
    f = alpha.files.create(file=("in.jsonl", jsonl(LINES)), purpose="batch")
    alpha.files.delete(f.id)
    inject_batch(r, "batch_0100", f.id, total="3")
    b = wait_done(alpha, "batch_0100")
    assert b.status == "failed" and counts(b) == (0, 0, 0), b
    assert b.errors is not None and b.errors.data is not None
    (err,) = b.errors.data
    assert (err.code, err.param) == ("input_file_deleted", "input_file_id"), err
    assert f.id in (err.message or "") and "no line was run" in (err.message or ""), err
    # deleted before validation: was `empty_file: the input file has no lines`
    inject_batch(r, "batch_0101", f.id, status="validating")
    b = wait_done(alpha, "batch_0101")
    assert b.status == "failed" and counts(b) == (0, 0, 0), b
    assert b.errors is not None and b.errors.data is not None
    assert [e.code for e in b.errors.data] == ["input_file_deleted"], b.errors
    # the tester's sequence: whichever way the race goes, the counts add up
    for _ in range(3):
        f = alpha.files.create(file=("in.jsonl", jsonl(LINES)), purpose="batch")
        bid = alpha.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                   completion_window="24h").id
        alpha.files.delete(f.id)
        b = wait_done(alpha, bid)
        add_up(b)
        if b.status == "failed":
            assert b.errors is not None and b.errors.data is not None
            assert [e.code for e in b.errors.data] == ["input_file_deleted"], b.errors
        else:
            assert b.status == "completed" and counts(b) == (3, 3, 0), b
    r.close()


def test_a_cancel_while_validating_counts_every_line_cancelled(stack: Stack) -> None:
    """As a mid-run cancel: every validated line is in the output or the error file, the
    ones that did not run as `batch_cancelled` (was `cancelled` 0 + 0 of 3, no error
    file). Injected: the record validation leaves when the cancel came during it."""
    r, alpha = redis_of(stack), client(stack, "alpha")
    f = alpha.files.create(file=("in.jsonl", jsonl(LINES)), purpose="batch")
    inject_batch(r, "batch_0200", f.id, status="cancelling", total="3", enqueue_done="1")
    b = wait_done(alpha, "batch_0200")
    assert b.status == "cancelled" and counts(b) == (3, 0, 3), b
    assert b.output_file_id is None
    errs = read_lines(alpha, b.error_file_id)
    assert set(errs) == {"c1", "c2", "c3"}, errs
    for x in errs.values():
        assert x["error"] == {"code": "batch_cancelled",
                              "message": "the request was cancelled before it ran"}, x
    assert {x["id"] for x in errs.values()} == {f"batch_req_0200_{n}" for n in (1, 2, 3)}
    # lines never enqueued get no job record each (a cancel while a 50,000-line batch
    # validated wrote 50,000, kept as long as the batch's files)
    assert not any(r.exists(keys.job(f"job_0200_{n}")) for n in (1, 2, 3))
    # the tester's sequence (cancel right after create): the counts add up, each line that
    # did not run is in the error file
    for _ in range(3):
        bid = create(alpha, LINES)
        assert alpha.batches.cancel(bid).status == "cancelling"
        b = wait_done(alpha, bid)
        assert b.status == "cancelled", b
        add_up(b)
        if counts(b)[2]:
            assert len(read_lines(alpha, b.error_file_id)) == counts(b)[2]
    r.close()


def poll_by_list(oai: openai.OpenAI, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        b = next(x for x in oai.batches.list(limit=100).data if x.id == batch_id)
        if b.status in {"completed", "failed", "expired", "cancelled"}:
            return b
        assert time.monotonic() < deadline, b
        time.sleep(0.2)


def test_a_finished_batch_s_files_resolve_whichever_route_showed_them(stack: Stack) -> None:
    """Polled with batches.list only: its output_file_id was a 404 on files.content and
    missing from files.list (registered only by batches.retrieve)."""
    alpha = client(stack, "alpha")
    bid = create(alpha, LINES)
    b = poll_by_list(alpha, bid)
    assert b.status == "completed" and counts(b) == (3, 3, 0), b
    assert set(read_lines(alpha, b.output_file_id)) == {"c1", "c2", "c3"}
    assert alpha.files.retrieve(b.output_file_id or "").purpose == "batch_output"
    assert b.output_file_id in {x.id for x in alpha.files.list(purpose="batch_output")}


def test_batch_output_files_report_their_size(stack: Stack) -> None:
    """Was `bytes: 0` for every output and error file."""
    r, alpha = redis_of(stack), client(stack, "alpha")
    bid = create(alpha, LINES)
    b = wait_done(alpha, bid)
    f = alpha.files.create(file=("in.jsonl", jsonl(LINES)), purpose="batch")
    inject_batch(r, "batch_0300", f.id, status="cancelling", total="3", enqueue_done="1")
    cancelled = wait_done(alpha, "batch_0300")
    for file_id in (b.output_file_id, cancelled.error_file_id):
        assert file_id
        size = len(alpha.files.content(file_id).content)
        assert size > 0 and alpha.files.retrieve(file_id).bytes == size
        listed = {x.id: x.bytes for x in alpha.files.list(purpose="batch_output")}
        assert listed[file_id] == size
    r.close()


def test_a_deleted_output_file_stays_deleted(stack: Stack) -> None:
    """It came back on the next batches.retrieve, re-indexed at that time (files.list no
    longer newest first). The batch keeps showing its id, as OpenAI's does."""
    alpha = client(stack, "alpha")
    b = wait_done(alpha, create(alpha, LINES))
    out = b.output_file_id
    assert out
    newer = alpha.files.create(file=("later.jsonl", jsonl(LINES)), purpose="batch")
    assert alpha.files.delete(out).deleted
    for _ in range(2):
        assert alpha.batches.retrieve(b.id).output_file_id == out
        assert any(x.id == b.id and x.output_file_id == out
                   for x in alpha.batches.list(limit=100).data)
        with pytest.raises(openai.NotFoundError):
            alpha.files.retrieve(out)
        with pytest.raises(openai.NotFoundError):
            alpha.files.content(out)
    listed = alpha.files.list().data
    assert out not in {x.id for x in listed}
    assert listed[0].id == newer.id  # still newest first
    created = [x.created_at for x in listed]
    assert created == sorted(created, reverse=True)


def test_lists_refuse_an_unknown_after_and_files_take_an_order(stack: Stack) -> None:
    """`after` naming nothing in the list was a 200 with the first page (jobs: 400);
    files.list(order="asc") was ignored."""
    beta = client(stack, "beta")
    with pytest.raises(openai.BadRequestError, match="no batch"):
        beta.batches.list(after="batch_unknown")
    with pytest.raises(openai.BadRequestError, match="no file"):
        beta.files.list(after="file-unknown")
    ids = []
    for n in range(3):
        ids.append(beta.files.create(file=(f"{n}.jsonl", jsonl(LINES)), purpose="batch").id)
        time.sleep(0.01)  # distinct creation times
    asc = [x.id for x in beta.files.list(order="asc").data]
    assert [x for x in asc if x in ids] == ids
    desc = [x.id for x in beta.files.list(order="desc").data]
    assert [x for x in desc if x in ids] == ids[::-1]
    page = beta.files.list(order="asc", limit=1, after=ids[0])
    assert [x.id for x in page.data] == [ids[1]] and page.has_more
    with pytest.raises(openai.BadRequestError):
        beta.files.list(order="sideways")  # type: ignore[arg-type]
    bids = [create(beta, LINES[:1]) for _ in range(2)]
    assert beta.batches.list(after=bids[1]).data[0].id == bids[0]


def test_a_repeated_cancel_answers_the_batch_and_a_finished_one_is_409(stack: Stack) -> None:
    """docs/api.md said `409 cancelling a finished batch` while a cancelled one answers 200:
    the docs now say exactly what happens (OpenAI's API answers a repeated cancel with the
    batch too)."""
    alpha = client(stack, "alpha")
    bid = create(alpha, LINES)
    alpha.batches.cancel(bid)
    b = wait_done(alpha, bid)
    assert b.status == "cancelled"
    again = alpha.batches.cancel(bid)
    assert (again.id, again.status, again.request_counts) == (b.id, b.status, b.request_counts)
    done = wait_done(alpha, create(alpha, LINES))
    assert done.status == "completed"
    with pytest.raises(openai.ConflictError):
        alpha.batches.cancel(done.id)
    text = " ".join(DOC.read_text().split())
    assert ("409 cancelling a batch that is `completed`, `failed` or `expired` (cancelling a "
            "`cancelling` or `cancelled` batch answers 200 with the batch, unchanged") in text


def test_a_cancel_landing_after_the_last_line_leaves_the_batch_completed(
        stack: Stack) -> None:
    """The cancel looked at the status, then wrote `cancelling`: a cancel arriving just
    after the last line settled the batch turned a `completed` batch into `cancelling`,
    then `cancelled` (a second webhook). The look and the write are one script now: here
    the race's second half, the batch completed under a cancel that saw it in progress."""
    import asyncio

    import redis.asyncio as aioredis

    from tokenq.api.openai.batch_store import BatchStore
    from tokenq.shared import keys

    alpha = client(stack, "alpha")
    done = wait_done(alpha, create(alpha, LINES))
    assert done.status == "completed"

    async def cancel() -> str | None:
        r = aioredis.Redis.from_url(stack.redis_url, decode_responses=True)
        try:
            return await BatchStore(r, "").cancel(done.id)
        finally:
            await r.aclose()

    assert asyncio.run(cancel()) == "completed"
    r = redis_of(stack)
    assert r.hget(keys.batch(done.id), "status") == "completed"
    assert not r.sismember(keys.BATCHES_PENDING, done.id)
    assert alpha.batches.retrieve(done.id).status == "completed"


def test_a_finished_batch_expires_with_its_files_and_leaves_the_list(stack: Stack) -> None:
    """A batch's hash, its lists of lines and its entry in its tenant's index were kept for
    ever, after its files and its lines' records had expired. Now they expire with its
    files (FILE_TTL_S from its end), and listing drops what expired from the index."""
    r, beta = redis_of(stack), client(stack, "beta")
    ttl = 30 * 24 * 3600
    ids = [create(beta, LINES) for _ in range(3)]
    for batch_id in ids:
        assert wait_done(beta, batch_id).status == "completed"
        for key in (keys.batch(batch_id), keys.batch_out(batch_id)):
            assert 0 < r.ttl(key) <= ttl, key
        # its lines' records outlive it (its output file renders from them): they expired
        # FILE_TTL_S after their own ends, before the file, which counts from the batch's
        lines = [keys.job(f"job_{batch_id.removeprefix('batch_')}_{n}") for n in (1, 2, 3)]
        assert all(r.pttl(k) > r.pttl(keys.batch(batch_id)) + 3_600_000 for k in lines), [
            r.pttl(k) for k in lines]
    bad = create(beta, [chat_line("x", "hi", model="no-such-model")])
    assert wait_done(beta, bad).status == "failed"
    assert 0 < r.ttl(keys.batch(bad)) <= ttl  # failed at validation: the same
    r.delete(keys.batch(ids[1]))  # as its expiry does
    page = beta.batches.list(limit=2, after=bad)
    assert [b.id for b in page.data] == [ids[2], ids[0]], page
    assert [b.id for b in beta.batches.list(limit=1, after=ids[2]).data] == [ids[0]]
    # a client paging from the expired one pages on; the index lets it go only once it is
    # past every batch's life (at the tenant's next batch)
    assert [b.id for b in beta.batches.list(limit=1, after=ids[1]).data] == [ids[0]]
    index = keys.tenant_batches("beta")
    r.zadd(index, {ids[1]: time.time() - 40 * 24 * 3600})
    create(beta, LINES)
    assert r.zscore(index, ids[1]) is None and r.zscore(index, ids[0]) is not None
