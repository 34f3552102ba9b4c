"""One tenant's long batch does not hold another tenant's batch back, nor do stuck ones.

A replica's batch driver worked on pending batches one at a time: a tenant's 50,000-line
batch (a minute or more of validation, then its enqueue) kept every other tenant's batch
`validating` until it was through. Now a replica drives up to MAX_DRIVEN batches at once,
one per tenant (api/openai/batch_driver.py, `start_more`). Fake engine, real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE, FAKE_IDLE, fake_stack, redis_of
from tests.faults.test_batch_cancel import wait_for
from tests.faults.test_hostile_batches import client, create, inject_batch, wait_done
from tests.integration.test_openai_batches import chat_line, jsonl
from tokenq.cli.stack import Stack
from tokenq.shared import keys

LONG = 20_000  # alpha's lines: validating them takes several seconds even on a fast machine


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta,"
                              "key-gamma:gamma,key-delta:delta,key-omega:omega",
           "TOKENQ_API__QUEUE_LIMIT": "4"}  # batch lines fill a lane up to 3
    with fake_stack(tmp_path_factory.mktemp("driver-fair"), workers=1, env=env) as st:
        yield st


def test_a_small_batch_runs_while_another_tenants_long_one_validates(stack: Stack) -> None:
    alpha, beta = client(stack, "alpha"), client(stack, "beta")
    r: redis.Redis = redis_of(stack)
    long_id = create(alpha, [chat_line(f"a{i}", f"call {i}", model=FAKE) for i in range(LONG)])
    wait_for("a driver works on alpha's batch",
             lambda: bool(r.exists(keys.batch_driver(long_id))))
    small_id = create(beta, [chat_line("b0", "hi", model=FAKE)])
    try:
        wait_for("beta's batch validated",
                 lambda: beta.batches.retrieve(small_id).status != "validating", 120)
        small = beta.batches.retrieve(small_id)
        long_status = alpha.batches.retrieve(long_id).status
        # beta's batch was validated while alpha's was (a driver per batch, not in turn)
        assert long_status == "validating", (long_status, small.status)
        assert small.status in {"in_progress", "finalizing", "completed"}, small
    finally:
        alpha.batches.cancel(long_id)
    assert wait_done(alpha, long_id, timeout=300).status == "cancelled"


def test_batches_stuck_on_a_full_lane_hold_no_slot(stack: Stack) -> None:
    """Batches whose lines wait for room in a full lane (a model no worker serves here)
    take a few milliseconds a turn. Taken in id order at every look, four of them held
    every slot of the driver, so no batch sorted after them ran, and their tenants' other
    batches (one per tenant) never either. Now turns go round and a batch whose turn
    ended sits out a second. Ids are injected so that the fresh batches sort last."""
    r: redis.Redis = redis_of(stack)
    alpha = client(stack, "alpha")
    idle = alpha.files.create(file=("idle.jsonl", jsonl(
        [chat_line(f"i{n}", "hi", model=FAKE_IDLE) for n in range(6)])), purpose="batch")
    fresh = alpha.files.create(file=("fresh.jsonl", jsonl(
        [chat_line("f0", "hi", model=FAKE)])), purpose="batch")
    for n, owner in enumerate(["alpha", "beta", "gamma", "delta"], 1):
        inject_batch(r, f"batch_0a0{n}", idle.id, owner=owner, total="6")
    inject_batch(r, "batch_0a05", fresh.id, status="validating", total="0")  # alpha's
    inject_batch(r, "batch_0a06", fresh.id, owner="omega", status="validating", total="0")
    wait_for("the fresh batches complete", lambda: {
        r.hget(keys.batch(b), "status") for b in ("batch_0a05", "batch_0a06")} == {"completed"})
    for n in range(1, 5):  # the stuck ones still wait for room, untouched
        assert r.hget(keys.batch(f"batch_0a0{n}"), "status") == "in_progress"
