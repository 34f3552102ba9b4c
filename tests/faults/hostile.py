"""The hostile-tenant suite's stack and helpers (tests/faults/test_hostile_*.py).

Two tenants on one real stack: `alpha` attacks with its one valid key, `beta` is the
victim whose streams, jobs and chat requests must finish meanwhile, whole. Also a tenant
granted `priority: high` (`rush`), Prometheus' key (`prom`, role `metrics`) and an admin.
Test modules import the fixtures by name (`from tests.faults.hostile import hostile`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.faults.harness import FAKE, fake_stack, redis_of
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events

HKEYS = {"alpha": "hk-alpha", "beta": "hk-beta", "admin": "hk-admin", "rush": "hk-rush",
         "prom": "hk-prom"}
RATE = 1000.0  # the fake engine's tokens/s per job: a 2,000-token job streams for ~2 s
BLOCK_MS = 1000  # the hub's XREAD BLOCK: an idle subscription spans several in seconds
MAX_FILES = 3
MAX_FILE_BYTES = 20_000
HOSTILE_ENV = {
    "TOKENQ_API_KEYS": ",".join([
        f"{HKEYS['alpha']}:alpha", f"{HKEYS['beta']}:beta", f"{HKEYS['admin']}:ops:admin",
        f"{HKEYS['rush']}:rush:high", f"{HKEYS['prom']}:prometheus:metrics"]),
    "TOKENQ_API__STREAM_BLOCK_MS": str(BLOCK_MS), "TOKENQ_API__SSE_PING_S": "1",
    "TOKENQ_API__TENANT_MAX_FILES": str(MAX_FILES),
    "TOKENQ_API__TENANT_MAX_FILE_BYTES": str(MAX_FILE_BYTES),
    "TOKENQ_API__MAX_BODY_BYTES": "200000",
    # a receiver on loopback (refused without the operator's allowlist)
    "TOKENQ_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
}


def hauth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {HKEYS[who]}"}


@pytest.fixture(scope="session")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with fake_stack(tmp_path_factory.mktemp("hostile"), workers=1, rate=RATE, slots=16,
                    env=HOSTILE_ENV) as st:
        yield st


@pytest.fixture(scope="session")
def hredis(hostile: Stack) -> Iterator[redis.Redis]:
    r = redis_of(hostile)
    yield r
    r.close()


def client(stack: Stack, who: str, timeout: float = 60) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=timeout, headers=hauth(who))


def logs_of(stack: Stack) -> dict[str, str]:
    """Every process's log so far (quiet stacks write them under state_dir/logs)."""
    d = Path(stack.settings.state_dir) / "logs"
    return {p.name: p.read_text(errors="replace") for p in sorted(d.glob("*.log"))}


class Victim:
    """Beta's work while alpha attacks: one SSE stream read in a thread (every event kept)
    and a non-streaming chat request, both on FAKE."""

    def __init__(self, stack: Stack, max_tokens: int = 2000):
        self.stack, self.max_tokens = stack, max_tokens
        self.events: list[RawEvent] = []
        self.chat: httpx.Response | None = None
        self.errors: list[BaseException] = []
        with client(stack, "beta") as c:
            resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "go",
                                            "max_tokens": max_tokens})
            assert resp.status_code == 202, resp.text
            self.job_id: str = resp.json()["id"]
        self._threads = [threading.Thread(target=self._stream, daemon=True),
                         threading.Thread(target=self._chat, daemon=True)]
        for t in self._threads:
            t.start()

    def _stream(self) -> None:
        try:
            with client(self.stack, "beta", timeout=120) as c:
                self.events = list(stream_events(c, self.job_id, timeout=120))
        except BaseException as exc:  # reported by finish()
            self.errors.append(exc)

    def _chat(self) -> None:
        try:
            with client(self.stack, "beta", timeout=120) as c:
                self.chat = c.post("/v1/chat/completions", json={
                    "model": FAKE, "max_tokens": self.max_tokens,
                    "messages": [{"role": "user", "content": "go"}]})
        except BaseException as exc:  # reported by finish()
            self.errors.append(exc)

    def finish(self) -> dict[str, Any]:
        """Both ended whole: the stream has every token once then `done`, the chat a 200."""
        for t in self._threads:
            t.join(timeout=150)
            assert not t.is_alive(), "the victim's request hung"
        assert not self.errors, self.errors
        assert self.events and self.events[-1].event == "done", self.events[-3:]
        idx = [e.data["index"] for e in self.events if e.event == "token"]
        assert idx == list(range(self.max_tokens)), "victim's stream lost or repeated tokens"
        assert self.chat is not None and self.chat.status_code == 200, self.chat
        body: dict[str, Any] = self.chat.json()
        assert body["usage"]["completion_tokens"] == self.max_tokens
        return body
