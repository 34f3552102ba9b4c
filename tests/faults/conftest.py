"""The fault-injection suite: every test here is marked `faults` (runs in CI by default)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.faults.harness import fake_stack, redis_of
from tokenq.cli.stack import Stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.faults)


# The shared stack of the client/security scenarios: API keys for two tenants and an
# admin, a 2 s SSE send timeout and a 2 s body timeout. Scenarios that kill or restart
# things start their own stack (tests/faults/harness.fake_stack).
KEYS = {"alpha": "key-alpha", "beta": "key-beta", "admin": "key-admin"}
SECURE_ENV = {
    "TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta,{KEYS['admin']}:ops:admin",
    "TOKENQ_API__SSE_SEND_TIMEOUT_S": "2", "TOKENQ_API__BODY_TIMEOUT_S": "2",
    "TOKENQ_API__MAX_BODY_BYTES": "200000",
    # the default: webhooks to public addresses only (the session's real-model stack puts
    # an allowlist for its loopback receivers in the environment)
    "TOKENQ_WEBHOOK_ALLOW_HOSTS": "",
}


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture(scope="session")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with fake_stack(tmp_path_factory.mktemp("secure"), workers=1, env=SECURE_ENV) as st:
        yield st


@pytest.fixture
def alpha(secure_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=secure_stack.url, timeout=30, headers=auth("alpha")) as c:
        yield c


@pytest.fixture
def secure_redis(secure_stack: Stack) -> Iterator[redis.Redis]:
    r = redis_of(secure_stack)
    yield r
    r.close()
