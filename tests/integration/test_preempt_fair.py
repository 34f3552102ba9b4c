"""Fair share's preemption on the real stack (API, Redis, one llama.cpp SmolLM2 worker
with 2 slots): while one tenant's jobs hold both slots and more of its jobs wait, another
tenant's job does not wait for one of them to end. One of the first tenant's jobs goes back
into its tenant's list and later continues its stream without gap or duplicate; the lane's
slot counts are back to nothing once everything ended."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.integration.test_preempt import (
    LOW_PROMPT,
    assert_stream_is_record,
    attach,
    two_slot_stack,
    wait_done,
    wait_tokens,
)
from tokenq.cli.stack import Stack
from tokenq.shared import keys

MODEL = "smol-fair"
HEAVY, LIGHT = {"Authorization": "Bearer k-heavy"}, {"Authorization": "Bearer k-light"}


@pytest.fixture(scope="module")
def fair_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with two_slot_stack(tmp_path_factory.mktemp("fair"), MODEL,
                        {"TOKENQ_API_KEYS": "k-heavy:heavy,k-light:light"}) as st:
        yield st


def submit(client: httpx.Client, who: dict[str, str], prompt: str, max_tokens: int) -> str:
    resp = client.post("/v1/jobs", headers=who, json={
        "model": MODEL, "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens, "temperature": 0})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def test_a_tenant_holding_every_slot_makes_room_for_another(fair_stack: Stack) -> None:
    with httpx.Client(base_url=fair_stack.url, timeout=60, headers=HEAVY) as client, \
            httpx.Client(base_url=fair_stack.url, timeout=60, headers=LIGHT) as other:
        heavy = [submit(client, HEAVY, LOW_PROMPT, 160) for _ in range(4)]
        watchers = [attach(client, j) for j in heavy]
        wait_tokens(client, heavy[1], 5)  # both slots are generating heavy's jobs
        light = submit(client, LIGHT, "Say hello.", 8)
        light_rec = wait_done(other, light)
        recs = [wait_done(client, j) for j in heavy]
        for t, _ in watchers:
            t.join(60)
        for rec, (_, seen) in zip(recs, watchers, strict=True):
            assert_stream_is_record(rec, seen)
        assert light_rec["status"] == "succeeded" and light_rec["preemptions"] == 0
        # light ran while both of heavy's first jobs still had tokens to write
        assert light_rec["finished_at"] < min(rec["finished_at"] for rec in recs)
        assert sum(rec["preemptions"] for rec in recs) >= 1
    r = redis.Redis.from_url(fair_stack.redis_url, decode_responses=True)
    try:
        lane = keys.lane(keys.queue(MODEL, "normal"))
        deadline = time.monotonic() + 30
        while r.hgetall(keys.lane_held(lane)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert r.hgetall(keys.lane_held(lane)) == {}
    finally:
        r.close()
