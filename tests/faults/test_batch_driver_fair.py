"""One tenant's long batch does not hold another tenant's batch back.

A replica's batch driver worked on pending batches one at a time: a tenant's 50,000-line
batch (a minute or more of validation, then its enqueue) kept every other tenant's batch
`validating` until it was through. Now a replica drives up to MAX_DRIVEN batches at once,
one per tenant (api/openai/batch_driver.py, `start_more`). Fake engine, real Redis.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.faults.conftest import KEYS
from tests.faults.harness import FAKE, fake_stack, redis_of
from tests.faults.test_hostile_batches import client, create
from tests.integration.test_openai_batches import chat_line
from tokenq.cli.stack import Stack
from tokenq.shared import keys

LONG = 20_000  # alpha's lines: validating them takes several seconds even on a fast machine


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta"}
    with fake_stack(tmp_path_factory.mktemp("driver-fair"), workers=1, env=env) as st:
        yield st


def test_a_small_batch_runs_while_another_tenants_long_one_validates(stack: Stack) -> None:
    alpha, beta = client(stack, "alpha"), client(stack, "beta")
    r: redis.Redis = redis_of(stack)
    long_id = create(alpha, [chat_line(f"a{i}", f"call {i}", model=FAKE) for i in range(LONG)])
    deadline = time.monotonic() + 60
    while not r.exists(keys.batch_driver(long_id)):  # a driver works on it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    small_id = create(beta, [chat_line("b0", "hi", model=FAKE)])
    try:
        deadline = time.monotonic() + 120
        while (small := beta.batches.retrieve(small_id)).status == "validating":
            assert time.monotonic() < deadline, small
            time.sleep(0.05)
        long_status = alpha.batches.retrieve(long_id).status
        # beta's batch was validated while alpha's was (a driver per batch, not in turn)
        assert long_status == "validating", (long_status, small.status)
        assert small.status in {"in_progress", "finalizing", "completed"}, small
    finally:
        alpha.batches.cancel(long_id)
    deadline = time.monotonic() + 300
    while alpha.batches.retrieve(long_id).status != "cancelled":
        assert time.monotonic() < deadline
        time.sleep(0.5)
