"""The webhook sender on a real Redis: idle, it waits on the outbox's bell instead of
polling; the job scripts ring it, so an event goes out at once; a failed attempt's retry
goes out when its backoff ends, not at the sender's next timeout; stop() ends its wait."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from tests.integration.test_adapter_watcher import until
from tests.integration.test_webhooks import Receiver
from tokenq.shared import keys
from tokenq.shared.redis_conn import block_limit_s
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore
from tokenq.workers import webhooks
from tokenq.workers.webhooks import WebhookSender

SETTINGS = Settings(webhook_allow_hosts=["127.0.0.1"], stream_maxlen=1000, result_ttl_s=600)
LONG_WAIT_S = 30.0  # an idle sender's longest wait here: only a ring ends it sooner


def client(r: redis.Redis, socket_timeout: float | None) -> redis.Redis:
    kw = r.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], db=kw["db"], decode_responses=True,
                       socket_timeout=socket_timeout)


def count_claims(s: WebhookSender) -> list[float]:
    """When each of the sender's claims was made, from now on."""
    claims: list[float] = []
    claim = s.outbox.claim

    def counted(lease_s: float, limit: int) -> tuple[list[str], float | None]:
        claims.append(time.monotonic())
        return claim(lease_s, limit)

    s.outbox.claim = counted  # type: ignore[method-assign]
    return claims


@pytest.fixture
def sender(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookSender]:
    monkeypatch.setattr(webhooks, "IDLE_MAX_S", LONG_WAIT_S)
    s = WebhookSender(client(r, 2 * LONG_WAIT_S + 5), SETTINGS, "w1")
    s.claims = count_claims(s)  # type: ignore[attr-defined]
    s.start()
    yield s
    s.stop()


def waiting_on_bell(r: redis.Redis) -> bool:
    """A client of this test's database is blocked in BLPOP: the sender waits on its bell."""
    db = r.connection_pool.connection_kwargs["db"]
    return any(c.get("cmd") == "blpop" and int(c.get("db", -1)) == db
               for c in r.client_list())


def end_job_with_webhook(r: redis.Redis, url: str) -> None:
    """A queued job with a webhook, cancelled: its terminal script puts the event in the
    outbox (and rings the bell)."""
    store = JobStore(r, SETTINGS)
    job_id = f"job_{time.monotonic_ns()}"
    store.create(job_id, {"id": job_id, "model": "m", "state": "queued", "webhook_url": url,
                          "owner": "t"},
                 tenant="t", queue="m", message="{}")
    store.cancel(job_id)


def test_an_idle_sender_waits_on_the_bell_and_an_event_rings_it(
        r: redis.Redis, sender: WebhookSender) -> None:
    rcv = Receiver()
    try:
        claims: list[float] = sender.claims  # type: ignore[attr-defined]
        assert until(lambda: len(claims) >= 1 and waiting_on_bell(r), 5.0)
        before, window_s = len(claims), 3.0
        # polling every 0.5 s claimed 6 times in 3 s
        assert not until(lambda: len(claims) - before > 1, window_s), \
            f"{len(claims) - before} claims within {window_s} s idle"
        sent = time.monotonic()
        end_job_with_webhook(r, rcv.url)
        # its wait would last ~27 s more: only the bell brings it this soon
        assert until(lambda: rcv.calls >= 1, 2.0), "the event waited for the sender's timeout"
        assert time.monotonic() - sent < 2.0
    finally:
        rcv.server.shutdown()


def test_a_retry_goes_out_when_its_backoff_ends(r: redis.Redis,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhooks, "IDLE_MAX_S", LONG_WAIT_S)
    s = WebhookSender(client(r, 2 * LONG_WAIT_S + 5), SETTINGS, "w1")
    # the first attempt fails, half a second in (the sender waits on the bell by then):
    # its retry is due 2 s after that
    rcv = Receiver(fail_first=1, delay_s=0.5)
    s.start()
    try:
        end_job_with_webhook(r, rcv.url)
        assert until(lambda: rcv.calls >= 1, 5.0)
        failed_at = time.monotonic() + 0.5
        assert until(lambda: rcv.calls >= 2, 10.0), "the retry waited for the sender's timeout"
        gap = time.monotonic() - failed_at
        # 2 s of backoff; waiting out the sender's 30 s timeout instead takes ~30 s
        assert gap < 5.0, f"the retry went out {gap:.1f} s after the failure"
        assert until(lambda: not r.zcard(keys.WEBHOOKS), 5.0)  # delivered: out of the outbox
    finally:
        s.stop()
        rcv.server.shutdown()


def test_stop_ends_the_wait_at_once(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhooks, "IDLE_MAX_S", LONG_WAIT_S)
    s = WebhookSender(client(r, 2 * LONG_WAIT_S + 5), SETTINGS, "w2")
    s.start()
    assert until(lambda: waiting_on_bell(r), 5.0)  # waiting on the bell now (30 s)
    t0 = time.monotonic()
    s.stop()
    took = time.monotonic() - t0
    assert not s._thread.is_alive()
    assert took < 2.0, f"stop took {took:.1f} s"


def test_a_wait_stays_inside_the_clients_socket_timeout(
        r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BLPOP longer than the client's socket timeout never returns (redis-py sends it
    again at each timeout): the sender's wait is capped at half that timeout."""
    monkeypatch.setattr(webhooks, "IDLE_MAX_S", LONG_WAIT_S)
    assert block_limit_s(client(r, 2.0), LONG_WAIT_S) == 1.0
    assert block_limit_s(client(r, None), 5.0) == 5.0
    s = WebhookSender(client(r, 2.0), SETTINGS, "w3")
    claims = count_claims(s)
    s.start()
    try:
        assert until(lambda: len(claims) >= 3, 8.0), f"{len(claims)} claims in 8 s"
    finally:
        s.stop()
