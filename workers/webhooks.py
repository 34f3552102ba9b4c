"""Completion webhooks: delivered by workers from an outbox in Redis, never by the API.

The job scripts put an event in the outbox (`tokenq:webhooks`, a zset scored by
the time of the next attempt) in the same atomic step as the terminal
transition (shared/lua/terminal.lua), so an event exists iff the job or batch
really ended. Any worker's sender claims due events by pushing their score
forward (a lease: if that worker dies, the event is due again later), counts the
attempt, POSTs, and removes the event on a 2xx; failures back off exponentially,
and after `webhook_max_attempts` attempts the event is given up.

An idle sender does not poll: the same script that puts an event in the outbox rings a
bell (a one-entry list), and the sender waits on it with BLPOP until the next event in the
outbox is due (a retry's backoff, a dead sender's lease), at most `IDLE_MAX_S`. One idle
sender wakes per ring and claims every due event; the others look at their next timeout.

A receiver is a stranger on the tenant's side, so each attempt is bounded: the
URL must pass the address policy again at send time (shared/webhook_policy.py),
the connection goes to the address that was checked, at most
`webhook_max_response_bytes` of the answer are read, and the whole attempt
(connect to last byte) ends after `webhook_attempt_s`. Deliveries run on an
event loop of their own, `webhook_senders` at once, so one slow receiver does not
hold back the others. The attempt is counted before the POST: a worker that dies
mid-send cannot make an event loop through the pool forever.

Signed the Standard Webhooks way (what OpenAI's webhooks use), with the owning
tenant's secret (`whsec_<base64>`, the HMAC key is the decoded bytes):
    webhook-id, webhook-timestamp, webhook-signature: v1,<base64 HMAC-SHA256 of
    "{id}.{timestamp}.{body}">
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import threading
import time

import httpx
import redis

from tokenq.shared import keys
from tokenq.shared.lua_scripts import Scripts
from tokenq.shared.parsing import secret_key
from tokenq.shared.redis_conn import block_limit_s
from tokenq.shared.settings import Settings
from tokenq.shared.webhook_policy import AddressPolicy, UnsafeWebhook, resolve, tenant_secret

log = logging.getLogger(__name__)

GIVE_UP_KEEP_S = 7 * 24 * 3600  # an event given up on stays readable this long
IDLE_MAX_S = 5.0  # the longest an idle sender waits on its bell (a ring lost to a failover)
RETRY_S = 1.0  # after a failed claim or wait


class WebhookOutbox:
    """The outbox's Redis side: claim due events, read one, settle it."""

    def __init__(self, r: redis.Redis):
        self.r = r
        self._scripts = Scripts(r, ("claim",))

    def claim(self, lease_s: float, limit: int) -> tuple[list[str], float | None]:
        """Due events, each leased to this sender for `lease_s`, and when the next event
        in the outbox is due (None: it is empty)."""
        ids, next_due = self._scripts["claim"](keys=[keys.WEBHOOKS],
                                               args=[time.time(), lease_s, limit])
        return list(ids), None if next_due is None else float(next_due)

    def wait(self, own_bell: str, timeout_s: float) -> None:
        """Until the outbox's bell or `own_bell` rings, at most `timeout_s` (the client's
        socket timeout must exceed it)."""
        self.r.blpop([keys.WEBHOOK_BELL, own_bell], timeout=timeout_s)

    def ring(self, own_bell: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.lpush(own_bell, "1")
        pipe.ltrim(own_bell, 0, 0)
        pipe.expire(own_bell, 60)
        pipe.execute()

    def event(self, event_id: str) -> dict[str, str]:
        h: dict[str, str] = self.r.hgetall(keys.webhook(event_id))  # type: ignore[assignment]
        return h

    def begin(self, event_id: str, max_attempts: int) -> int | None:
        """Count an attempt before making it; None: the attempts are used up (given up)."""
        attempts = int(self.r.hincrby(keys.webhook(event_id), "attempts", 1))
        if attempts > max_attempts:
            self.give_up(event_id)
            return None
        return attempts

    def delivered(self, event_id: str) -> None:
        self.r.zrem(keys.WEBHOOKS, event_id)
        self.r.delete(keys.webhook(event_id))

    def failed(self, event_id: str, attempts: int, max_attempts: int) -> None:
        """After a failed attempt (already counted): due again after a backoff, or given up."""
        if attempts >= max_attempts:
            self.give_up(event_id)
        else:
            self.r.zadd(keys.WEBHOOKS, {event_id: time.time() + min(300, 2 ** attempts)})

    def give_up(self, event_id: str) -> None:
        self.r.zrem(keys.WEBHOOKS, event_id)
        self.r.expire(keys.webhook(event_id), GIVE_UP_KEEP_S)

    def forget(self, event_id: str) -> None:
        self.r.zrem(keys.WEBHOOKS, event_id)


def sign(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    msg = f"{event_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), msg, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """What a receiver runs (examples and tests use it; so does the `standardwebhooks`
    library, with the same result)."""
    ts = int(headers["webhook-timestamp"])
    if abs(time.time() - ts) > tolerance_s:
        return False
    want = sign(secret, headers["webhook-id"], ts, body)
    return any(hmac.compare_digest(want, s) for s in headers["webhook-signature"].split())


class WebhookSender:
    def __init__(self, r: redis.Redis, settings: Settings, worker_id: str = ""):
        self.outbox = WebhookOutbox(r)
        self.s = settings
        self._own_bell = keys.webhook_bell(worker_id or f"pid{os.getpid()}")
        self._idle_max_s = block_limit_s(r, IDLE_MAX_S)
        self.policy = AddressPolicy(settings.webhook_allow_hosts)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenq-webhooks", daemon=True)

    def start(self) -> None:
        if not self.s.worker.webhook_secret and not self.s.worker.webhook_secrets:
            log.warning("TOKENQ_WORKER__WEBHOOK_SECRET is not set: webhooks are sent unsigned")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            self.outbox.ring(self._own_bell)  # ends its wait on the bell now
        except redis.RedisError:
            pass  # the wait ends within idle_max_s
        self._thread.join(timeout=self.s.worker.webhook_attempt_s + 2)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        s = self.s
        inflight: set[asyncio.Task[None]] = set()
        lease = s.worker.webhook_attempt_s * 2 + 1
        async with httpx.AsyncClient(timeout=s.worker.webhook_timeout_s, trust_env=False,
                                     follow_redirects=False) as http:
            while not self._stop.is_set():
                free = s.worker.webhook_senders - len(inflight)
                if free <= 0:  # every sender busy: claim again when one is done
                    await asyncio.wait(inflight, timeout=self._idle_max_s,
                                       return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    ids, next_due = await asyncio.to_thread(self.outbox.claim, lease, free)
                    for event_id in ids:
                        task = asyncio.create_task(self.deliver(http, event_id))
                        inflight.add(task)
                        task.add_done_callback(inflight.discard)
                    if ids:
                        await asyncio.sleep(0.05)  # (a burst: claim the rest in a moment)
                        continue
                    wait = self._idle_max_s if next_due is None else next_due - time.time()
                    await asyncio.to_thread(self.outbox.wait, self._own_bell,
                                            min(max(wait, 0.01), self._idle_max_s))
                except redis.RedisError as exc:
                    log.warning("webhooks: %s", exc)
                    await asyncio.sleep(RETRY_S)
                except Exception:  # the sender must outlive anything (a bug included)
                    log.exception("webhooks: claim failed")
                    await asyncio.sleep(RETRY_S)
            if inflight:
                await asyncio.wait(inflight, timeout=s.worker.webhook_attempt_s)

    async def deliver(self, http: httpx.AsyncClient, event_id: str) -> None:
        """One attempt at one event; never raises (a Redis error leaves it to its lease)."""
        try:
            await self._deliver(http, event_id)
        except redis.RedisError as exc:
            log.warning("webhook %s: %s", event_id, exc)
        except Exception:
            log.exception("webhook %s: delivery failed", event_id)

    async def _deliver(self, http: httpx.AsyncClient, event_id: str) -> None:
        s, outbox = self.s, self.outbox
        h = await asyncio.to_thread(outbox.event, event_id)
        if not h:
            await asyncio.to_thread(outbox.forget, event_id)
            return
        attempts = await asyncio.to_thread(outbox.begin, event_id, s.worker.webhook_max_attempts)
        if attempts is None:
            log.warning("webhook %s: giving up (attempts used up)", event_id)
            return
        try:
            ok = await asyncio.wait_for(self._post(http, event_id, h), s.worker.webhook_attempt_s)
        except TimeoutError:
            log.info("webhook %s: no answer within %.0f s", event_id, s.worker.webhook_attempt_s)
            ok = False
        except (UnsafeWebhook, httpx.HTTPError, OSError) as exc:
            # The URL is not logged: it often carries the receiver's token.
            log.info("webhook %s: %s", event_id, type(exc).__name__ + f": {exc}"[:200])
            ok = False
        if ok:
            await asyncio.to_thread(outbox.delivered, event_id)
            return
        await asyncio.to_thread(outbox.failed, event_id, attempts, s.worker.webhook_max_attempts)
        # its retry may be due before the sender's wait ends: wake it to wait until then
        await asyncio.to_thread(outbox.ring, self._own_bell)
        if attempts >= s.worker.webhook_max_attempts:
            log.warning("webhook %s: giving up after %d attempts", event_id, attempts)

    async def _post(self, http: httpx.AsyncClient, event_id: str, h: dict[str, str]) -> bool:
        scheme, host, port, ip = await resolve(self.policy, h["url"])
        ts = int(time.time())
        body = json.dumps({"object": "event", "id": event_id, "type": h["type"],
                           "created_at": int(float(h["created_at"])),
                           "data": {"id": h["object_id"]}}).encode()
        default_port = 443 if scheme == "https" else 80
        headers = {"content-type": "application/json", "webhook-id": event_id,
                   "webhook-timestamp": str(ts), "user-agent": "tokenq-webhooks",
                   "host": host if port == default_port else f"{host}:{port}"}
        secret = tenant_secret(self.s, h.get("tenant", ""))
        if secret:
            headers["webhook-signature"] = sign(secret, event_id, ts, body)
        # Pinned: connect to the address that passed the policy, not to a second lookup.
        url = httpx.URL(h["url"]).copy_with(host=str(ip))
        ext = {"sni_hostname": host} if scheme == "https" else {}
        cap = self.s.worker.webhook_max_response_bytes
        async with http.stream("POST", url, content=body, headers=headers,
                               extensions=ext) as resp:
            read = 0
            async for chunk in resp.aiter_raw():
                read += len(chunk)
                if read >= cap:
                    break  # enough to know it answered; the rest is not ours to buffer
            return resp.is_success
