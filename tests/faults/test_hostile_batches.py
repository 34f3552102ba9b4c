"""Hostile tenant, issue 17 item 4: a batch with a poisoned line.

A line of 100,000 `[` (RecursionError in json.loads) or a schema nested 100 deep used to
escape the per-line checks: the batch stayed `validating`, retried every second, and
the batches sorted after it never ran, on any replica. Now every line's failure is a
line error in the batch's `errors` (OpenAI's batch error shape) and the batch fails
alone; a batch whose processing raises is given up after a bounded number of tries
while the others go on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE, FAKE_IDLE, fake_stack, redis_of
from tests.integration.test_openai_batches import chat_line, jsonl
from tokenq.api.openai.batch_driver import MAX_DRIVER_FAILURES
from tokenq.cli.stack import Stack
from tokenq.shared import keys

NESTED = json.loads('{"type": "object", "properties": {"a": ' * 100 + "{}" + "}}" * 100)


def schema_line(custom_id: str, schema: dict[str, Any]) -> dict[str, Any]:
    return chat_line(custom_id, "hi", model=FAKE, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})


POISONED = [
    chat_line("good", "hi", model=FAKE),
    '{"custom_id": "deep", "body": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "[" * 100_000,
    schema_line("nested", NESTED),
    schema_line("crasher", {"type": "string", "maxLength": 20000}),
    '{"custom_id": "trunc',
    '{"custom_id": "lone", "url": "/v1/chat/completions", "body": {"model": "' + FAKE
    + '", "messages": [{"role": "user", "content": "x\\ud800"}]}}',  # a 500 before
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta"}
    with fake_stack(tmp_path_factory.mktemp("hostile-batches"), workers=1, env=env) as st:
        yield st


def client(stack: Stack, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=KEYS[tenant], max_retries=0,
                         timeout=60)


def create(oai: openai.OpenAI, lines: list[Any]) -> str:
    f = oai.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    return oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h").id


def wait_done(oai: openai.OpenAI, batch_id: str, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while (b := oai.batches.retrieve(batch_id)).status not in {"completed", "failed",
                                                                "expired", "cancelled"}:
        assert time.monotonic() < deadline, b
        time.sleep(0.2)
    return b


def beta_batches(stack: Stack, n: int = 3) -> list[str]:
    beta = client(stack, "beta")
    return [create(beta, [chat_line(f"b{i}-{k}", "hi", model=FAKE) for k in range(4)])
            for i in range(n)]


def assert_completed(stack: Stack, ids: list[str]) -> None:
    beta = client(stack, "beta")
    for batch_id in ids:
        b = wait_done(beta, batch_id)
        assert b.status == "completed", b
        assert b.request_counts is not None and b.request_counts.completed == 4, b
        out = [json.loads(x) for x in beta.files.content(b.output_file_id or "").text.splitlines()]
        assert len(out) == 4, out
        assert all(x["response"]["status_code"] == 200 for x in out)


def inject_batch(r: redis.Redis, batch_id: str, file_id: str, **fields: str) -> None:
    """Fault injection: alpha's batch record written straight into Redis, `in_progress`
    (validation skipped), pending for the drivers; `fields` override."""
    n = batch_id.removeprefix("batch_")
    r.hset(keys.batch(batch_id), mapping={
        "id": batch_id, "owner": "alpha", "endpoint": "/v1/chat/completions",
        "input_file_id": file_id, "completion_window": "24h", "status": "in_progress",
        "created_at": repr(time.time()), "expires_at": repr(time.time() + 3600),
        "output_file_id": f"file-{n}o", "error_file_id": f"file-{n}e", "total": "1",
        "completed": "0", "failed": "0", "enqueued": "0", "cursor": "0", **fields})
    r.zadd(keys.tenant_batches("alpha"), {batch_id: time.time()})
    r.sadd(keys.BATCHES_PENDING, batch_id)


def test_poisoned_lines_fail_their_batch_alone(stack: Stack) -> None:
    alpha = client(stack, "alpha")
    poisoned = create(alpha, POISONED)
    after = beta_batches(stack)
    b = wait_done(alpha, poisoned)
    assert b.status == "failed", b
    assert b.errors is not None and b.errors.data is not None
    by_line = {e.line: e for e in b.errors.data}
    assert set(by_line) == {2, 3, 4, 5, 6, 7}, b.errors
    assert by_line[2].code == by_line[3].code == by_line[6].code == "invalid_json"
    assert "nested" in (by_line[4].message or "") and by_line[4].param == "body.response_format"
    assert by_line[5].code == "schema_too_complex"
    assert (by_line[7].code, by_line[7].param) == ("invalid_text", "body.messages.0.content")
    assert_completed(stack, after)


def test_a_batch_that_raises_is_given_up_and_others_go_on(stack: Stack) -> None:
    """A batch record the driver cannot process (fault injected: a corrupt cursor on the
    batch that sorts first) raises on every try; after MAX_DRIVER_FAILURES it is failed,
    and the other tenant's batches complete meanwhile."""
    r = redis_of(stack)
    bad = "batch_0000"  # sorts before every uuid-named batch
    alpha = client(stack, "alpha")
    f = alpha.files.create(file=("in.jsonl", jsonl([chat_line("a", "hi", model=FAKE)])),
                           purpose="batch")
    inject_batch(r, bad, f.id, cursor="not a number")
    after = beta_batches(stack)
    assert_completed(stack, after)
    b = wait_done(alpha, bad)
    assert b.status == "failed", b
    assert b.errors is not None and b.errors.data is not None
    assert b.errors.data[0].code == "batch_processing_failed"
    assert r.hget(keys.batch(bad), "driver_failures") == str(MAX_DRIVER_FAILURES)
    assert not r.sismember(keys.BATCHES_PENDING, bad)
    r.close()


def test_a_line_that_fails_at_enqueue_fails_alone(stack: Stack) -> None:
    """Lines pass validation, then fail when enqueued (fault injected: the batch is put
    `in_progress` directly, as if validation had passed and then the model went away):
    each such line becomes a line of the error file (OpenAI's shape, status 400) and is
    counted as failed; the batch's other lines run and it completes."""
    r = redis_of(stack)
    alpha = client(stack, "alpha")
    lines = [chat_line("ok-1", "hi", model=FAKE), chat_line("gone", "hi", model="no-such-model"),
             "[" * 100_000, chat_line("ok-2", "hi", model=FAKE)]
    f = alpha.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    bid = "batch_0001"
    inject_batch(r, bid, f.id, total="4")
    after = beta_batches(stack, 1)
    b = wait_done(alpha, bid)
    assert b.status == "completed", b
    assert b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (2, 2), b
    errs = [json.loads(x) for x in alpha.files.content(b.error_file_id or "").text.splitlines()]
    assert sorted(e["custom_id"] for e in errs) == ["", "gone"]
    for e in errs:
        body = e["response"]["body"]["error"]
        assert e["response"]["status_code"] == 400 and body["message"], e
    assert {e["response"]["body"]["error"]["code"] for e in errs} == {"model_not_found",
                                                                      "invalid_json"}
    assert_completed(stack, after)
    r.close()


@pytest.fixture
def small_lane(tmp_path: Path) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta",
           "TOKENQ_API__QUEUE_LIMIT": "20", "TOKENQ_API__BATCH_CHUNK": "4"}
    with fake_stack(tmp_path, workers=1, env=env) as st:
        yield st


def test_one_tenant_s_batch_leaves_room_in_the_lane_for_the_others(small_lane: Stack) -> None:
    """An outside probe: a 12,000-line batch held the `low` lane at its limit (10,000) and
    every other tenant's `low` job got 429 until it drained. Batch lines fill a lane to
    90% of its limit (api/openai/batch_driver.py, batch_lane_limit)."""
    alpha, r = client(small_lane, "alpha"), redis_of(small_lane)
    batch = create(alpha, [chat_line(f"l{i}", "hi", model=FAKE_IDLE) for i in range(30)])
    lane = keys.queue(FAKE_IDLE, "low")
    deadline = time.monotonic() + 60
    while r.hget(keys.batch(batch), "cursor") != "18":  # 18 of 20 lines enqueued, then full
        assert time.monotonic() < deadline, (r.hgetall(keys.batch(batch)), r.llen(lane))
        time.sleep(0.1)
    with httpx.Client(base_url=small_lane.url, timeout=30,
                      headers={"Authorization": f"Bearer {KEYS['beta']}"}) as beta:
        resp = beta.post("/v1/jobs", json={"model": FAKE_IDLE, "prompt": "x",
                                           "priority": "low", "max_tokens": 2})
        assert resp.status_code == 202, resp.text
        beta.delete(f"/v1/jobs/{resp.json()['id']}")
    assert r.hget(keys.batch(batch), "cursor") == "18", r.hgetall(keys.batch(batch))
    alpha.batches.cancel(batch)
