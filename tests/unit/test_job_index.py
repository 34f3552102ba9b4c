"""A tenant's job index (GET /v1/jobs reads it) drops ids past every job's retention when
a job is created (shared/lua/create.lua), not only when a listing meets them: a tenant
that never listed kept an id for every job it ever ran."""

from __future__ import annotations

import time

import redis

from tests.unit.test_eta import submit
from tests.unit.test_fair_share import store
from tokenq.shared import keys
from tokenq.shared.store import index_horizon_s


def test_ids_past_every_retention_leave_the_index_at_the_next_create(
        r: redis.Redis) -> None:
    s = store(r)
    index = keys.tenant_jobs("a")
    horizon = index_horizon_s(s.s)
    assert horizon >= s.s.api.file_ttl_s + 86400  # a batch line's window and its files
    now = time.time()
    r.zadd(index, {"job_ancient": now - horizon - 60, "job_recent": now - horizon + 3600})
    j, _ = submit(s, "a")
    assert r.zrange(index, 0, -1) == ["job_recent", j]
