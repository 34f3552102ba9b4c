"""Completion webhooks: delivered by workers from an outbox in Redis, never by the API.

The job scripts put an event in the outbox (`tokenq:webhooks`, a zset scored by
the time of the next attempt) in the same atomic step as the terminal
transition (shared/lua/terminal.lua), so an event exists iff the job or batch
really ended. Any worker's sender thread claims due events by pushing their
score forward (a lease: if that worker dies, the event is due again later),
POSTs them, and removes them on a 2xx; failures back off exponentially up to
`webhook_max_attempts`.

Signed the Standard Webhooks way (what OpenAI's webhooks use):
    webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256 of
    "{id}.{timestamp}.{body}" with the secret>
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import threading
import time

import httpx
import redis

from shared import keys, logs
from shared.scripts import Scripts
from shared.settings import Settings

log = logging.getLogger(__name__)

GIVE_UP_KEEP_S = 7 * 24 * 3600  # an event given up on stays readable this long


class WebhookOutbox:
    """The outbox's Redis side: claim due events, read one, settle it."""

    def __init__(self, r: redis.Redis):
        self.r = r
        self._scripts = Scripts(r, ("claim",))

    def claim(self, lease_s: float, limit: int) -> list[str]:
        """Due events, each leased to this sender for `lease_s`."""
        ids: list[str] = self._scripts["claim"](keys=[keys.WEBHOOKS],
                                                args=[time.time(), lease_s, limit])
        return ids

    def event(self, event_id: str) -> dict[str, str]:
        h: dict[str, str] = self.r.hgetall(keys.webhook(event_id))  # type: ignore[assignment]
        return h

    def delivered(self, event_id: str) -> None:
        self.r.zrem(keys.WEBHOOKS, event_id)
        self.r.delete(keys.webhook(event_id))

    def failed(self, event_id: str, max_attempts: int) -> int:
        """Count a failed attempt; due again after a backoff, or given up. Attempts so far."""
        attempts = int(self.r.hincrby(keys.webhook(event_id), "attempts", 1))
        if attempts >= max_attempts:
            self.r.zrem(keys.WEBHOOKS, event_id)
            self.r.expire(keys.webhook(event_id), GIVE_UP_KEEP_S)
        else:
            self.r.zadd(keys.WEBHOOKS, {event_id: time.time() + min(300, 2 ** attempts)})
        return attempts

    def forget(self, event_id: str) -> None:
        self.r.zrem(keys.WEBHOOKS, event_id)



def sign(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    msg = f"{event_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), msg, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """What a receiver runs (examples and tests use it)."""
    ts = int(headers["webhook-timestamp"])
    if abs(time.time() - ts) > tolerance_s:
        return False
    want = sign(secret, headers["webhook-id"], ts, body)
    return any(hmac.compare_digest(want, s) for s in headers["webhook-signature"].split())


class WebhookSender:
    def __init__(self, r: redis.Redis, settings: Settings):
        self.outbox = WebhookOutbox(r)
        self.s = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenq-webhooks", daemon=True)
        self._http = httpx.Client(timeout=settings.webhook_timeout_s)

    def start(self) -> None:
        if not self.s.webhook_secret:
            log.warning("TOKENQ_WEBHOOK_SECRET is not set: webhooks are sent unsigned")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.s.webhook_timeout_s + 1)
        self._http.close()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.deliver_due()
            except redis.RedisError as exc:
                log.warning("webhooks: %s", exc)

    def deliver_due(self) -> int:
        lease = self.s.webhook_timeout_s * 2 + 1
        ids = self.outbox.claim(lease, 20)
        for event_id in ids:
            self._deliver(event_id)
        return len(ids)

    def _deliver(self, event_id: str) -> None:
        h = self.outbox.event(event_id)
        if not h:
            self.outbox.forget(event_id)
            return
        ts = int(time.time())
        body = json.dumps({"object": "event", "id": event_id, "type": h["type"],
                           "created_at": int(float(h["created_at"])),
                           "data": {"id": h["object_id"]}}).encode()
        headers = {"content-type": "application/json", "webhook-id": event_id,
                   "webhook-timestamp": str(ts), "user-agent": "tokenq-webhooks"}
        if self.s.webhook_secret:
            headers["webhook-signature"] = sign(self.s.webhook_secret, event_id, ts, body)
        try:
            ok = self._http.post(h["url"], content=body, headers=headers).is_success
        except httpx.HTTPError as exc:
            log.info("webhook %s to %s: %s", event_id, logs.url_host(h["url"]),
                     type(exc).__name__)
            ok = False
        if ok:
            self.outbox.delivered(event_id)
            return
        attempts = self.outbox.failed(event_id, self.s.webhook_max_attempts)
        if attempts >= self.s.webhook_max_attempts:
            log.warning("webhook %s to %s: giving up after %d attempts", event_id,
                        logs.url_host(h["url"]), attempts)
