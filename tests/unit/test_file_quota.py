"""A tenant's upload quota: while files live in Redis' memory, the lower limit applies."""

from __future__ import annotations

from tokenq.api.openai.files import tenant_quota
from tokenq.shared.settings import Settings


def test_on_disk_the_disk_quota() -> None:
    assert tenant_quota(10_000, 1_000, in_redis=False) == 10_000
    assert tenant_quota(0, 1_000, in_redis=False) == 0


def test_in_redis_the_lower_non_zero_quota() -> None:
    assert tenant_quota(10_000, 1_000, in_redis=True) == 1_000
    assert tenant_quota(500, 1_000, in_redis=True) == 500
    assert tenant_quota(0, 1_000, in_redis=True) == 1_000
    assert tenant_quota(10_000, 0, in_redis=True) == 10_000
    assert tenant_quota(0, 0, in_redis=True) == 0


def test_defaults_bound_redis_memory() -> None:
    api = Settings().api
    assert tenant_quota(api.tenant_max_file_bytes, api.tenant_max_redis_file_bytes,
                        in_redis=True) == 1_000_000_000
