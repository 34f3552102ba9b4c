"""Hostile tenant, issue 17 item 5: webhooks.

A tenant names the URL the worker POSTs to. Tried here: internal addresses (SSRF:
refused at submit, and again at send time), a receiver that answers without end
(read capped), one that drips a byte a second (the attempt ends at
TOKENQ_WORKER__WEBHOOK_ATTEMPT_S, and other tenants' events are delivered meanwhile), and
signatures: each tenant's own Standard Webhooks secret, checked with the official
`standardwebhooks` library. Every receiver listens on loopback: nothing here sends to
any other address (169.254.169.254 and the like are only refused, never connected to).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from tests.faults.conftest import KEYS, auth
from tests.faults.harness import FAKE, fake_stack, redis_of, wait_terminal
from tests.faults.test_abusive_input import assert_envelope, counts
from tokenq.shared import keys
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.webhook_policy import AddressPolicy, is_public, literal_ip, tenant_secret
from tokenq.workers.webhooks import WebhookSender

MASTER = "whsec_" + base64.b64encode(b"master-secret-of-the-fault-tests").decode()
ALPHA_SECRET = "whsec_" + base64.b64encode(b"alpha's very own webhook secret!").decode()
BETA_SECRET = tenant_secret(Settings(worker={"webhook_secret": MASTER}), "beta") or ""

REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://192.168.1.10/",
    "http://172.16.0.1:6379/", "http://100.64.0.1/", "http://224.0.0.1/", "http://0.0.0.0/",
    "http://240.0.0.1/", "http://255.255.255.255/", "http://127.0.0.2:6379/",
    "http://[::1]/", "http://[fe80::1]/", "http://[fc00::1]/", "http://[ff02::1]/",
    "http://[::ffff:169.254.169.254]/", "http://[::ffff:10.0.0.1]/",
    "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:a9fe:a9fe::1]/", "http://[::]/",
    "file:///etc/passwd", "gopher://127.0.0.1:6379/", "ftp://example.com/",
    "http://user:pw@127.0.0.1/", "http:///nohost", "not a url",
]


class Receiver:
    """A loopback HTTP endpoint: `mode` ok (200, records), endless (200, a body without
    end) or drip (one byte of the status line a second, until the sender hangs up)."""

    def __init__(self, mode: str = "ok", host: str = "127.0.0.1"):
        self.mode = mode
        self.events: list[tuple[dict[str, str], bytes]] = []
        self.calls = 0
        self.dripping = threading.Event()  # a drip connection is open now
        self.hung_up = threading.Event()  # the sender closed a drip connection
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                outer.calls += 1
                outer.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                try:
                    getattr(outer, "_" + outer.mode)(self)
                except OSError:
                    outer.hung_up.set()
                    outer.dripping.clear()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_port}/hook?token=t0p-secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def _ok(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("content-length", "2")
        h.end_headers()
        h.wfile.write(b"ok")

    @staticmethod
    def _endless(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()  # no length: the body ends when the connection does
        chunk = b"x" * 65536
        for _ in range(100_000):  # 6.5 GB if the sender read it all
            h.wfile.write(chunk)

    def _drip(self, h: BaseHTTPRequestHandler) -> None:
        self.dripping.set()
        for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(1)

    def wait(self, n: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < n:
            assert time.monotonic() < deadline, f"{len(self.events)} of {n} webhooks arrived"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers() -> Iterator[dict[str, Receiver]]:
    got = {m: Receiver(m) for m in ("ok", "endless", "drip")}
    yield got
    for rcv in got.values():
        rcv.close()


ENV = {"TOKENQ_API_KEYS": f"{KEYS['alpha']}:alpha,{KEYS['beta']}:beta",
       "TOKENQ_WORKER__WEBHOOK_SECRET": MASTER,
       "TOKENQ_WORKER__WEBHOOK_SECRETS": f"alpha:{ALPHA_SECRET}",
       "TOKENQ_WEBHOOK_ALLOW_HOSTS": "127.0.0.1", "TOKENQ_WORKER__WEBHOOK_MAX_ATTEMPTS": "2"}


def job_with_hook(c: httpx.Client, url: str) -> str:
    resp = c.post("/v1/jobs", json={"model": FAKE, "prompt": "hi", "max_tokens": 3,
                                    "metadata": {"webhook_url": url}})
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def test_webhook_receivers_cannot_hurt_the_sender(tmp_path: Path,
                                                  receivers: dict[str, Receiver]) -> None:
    """One worker, so one sender: alpha's dripping receiver holds an attempt while beta's
    event is delivered; alpha's endless one is read to the cap; every event is signed with
    its tenant's own secret; the worker never dies."""
    ok, endless, drip = receivers["ok"], receivers["endless"], receivers["drip"]
    with fake_stack(tmp_path, workers=1, env=ENV) as st:
        r = redis_of(st)
        with httpx.Client(base_url=st.url, timeout=30, headers=auth("alpha")) as alpha, \
                httpx.Client(base_url=st.url, timeout=30, headers=auth("beta")) as beta:
            slow = job_with_hook(alpha, drip.url)
            assert drip.dripping.wait(90), "the drip receiver was never called"
            drip_from = time.monotonic()
            # The attempt is counted before the POST (a crash mid-send cannot loop).
            events = r.zrange(keys.WEBHOOKS, 0, -1)
            assert [r.hget(keys.webhook(e), "attempts") for e in events] == ["1"]
            fast = job_with_hook(beta, ok.url)
            huge = job_with_hook(alpha, endless.url)
            own = job_with_hook(alpha, ok.url)
            ok.wait(2)
            assert drip.dripping.is_set()  # delivered while the slow receiver still held one
            endless.wait(1)
            assert drip.hung_up.wait(60), "the dripping attempt was never cut off"
            drip_s = time.monotonic() - drip_from
            wait_terminal(r, [slow, fast, huge, own], 60)
            # The endless answer was a 2xx read up to the cap: delivered, not retried.
            deadline = time.monotonic() + 60
            while r.zcard(keys.WEBHOOKS) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert endless.calls == 1 and ok.calls == 2
            assert drip.calls == 2  # two attempts (TOKENQ_WORKER__WEBHOOK_MAX_ATTEMPTS), given up
            assert all(p.poll() is None for _, p in st.worker_procs), "a worker died"
        by_object = {json.loads(b)["data"]["id"]: (h, b) for h, b in ok.events}
        h, b = by_object[fast]
        assert verified(BETA_SECRET, h, b) and not verified(ALPHA_SECRET, h, b)
        h, b = by_object[own]
        assert verified(ALPHA_SECRET, h, b) and not verified(BETA_SECRET, h, b)
        assert not verified(MASTER, h, b)  # the operator's master key is no tenant's key
        assert h["webhook-signature"].startswith("v1,")
        r.close()
    print(f"\n[faults] webhooks: dripping receiver cut off after {drip_s:.1f} s (attempt cap "
          f"10 s), other tenant delivered meanwhile; endless body read to the 64 KiB cap; "
          f"signatures verified per tenant with standardwebhooks")


def test_internal_addresses_are_refused_at_submit(tmp_path: Path) -> None:
    """Allowlist 127.0.0.1 (the tests' receivers) and nothing else: every internal or
    malformed URL is a 400 on every route that takes one, and nothing is enqueued."""
    with fake_stack(tmp_path, workers=1, env=ENV) as st, \
            httpx.Client(base_url=st.url, timeout=30, headers=auth("alpha")) as alpha:
        r = redis_of(st)
        for url in REFUSED_URLS:
            meta = {"webhook_url": url}
            before = counts(r)
            for path, body in [
                    ("/v1/jobs", {"model": FAKE, "prompt": "hi", "metadata": meta}),
                    ("/v1/chat/completions", {"model": FAKE, "metadata": meta, "messages": [
                        {"role": "user", "content": "hi"}]}),
                    ("/v1/completions", {"model": FAKE, "prompt": "hi", "metadata": meta})]:
                resp = alpha.post(path, json=body)
                assert_envelope(resp, 400)
                assert resp.json()["error"]["param"] == "metadata.webhook_url", (url, resp.text)
            f = alpha.post("/v1/files", files={"file": ("b.jsonl", b"{}\n")},
                           data={"purpose": "batch"}).json()
            resp = alpha.post("/v1/batches", json={
                "input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                "completion_window": "24h", "metadata": meta})
            assert_envelope(resp, 400)
            assert counts(r) == before, url
        r.close()
    print(f"\n[faults] {len(REFUSED_URLS)} internal or malformed webhook URLs x 4 routes: "
          "all 400, nothing enqueued")


def test_loopback_is_refused_without_the_allowlist(alpha: httpx.Client) -> None:
    """The shared secure stack has no TOKENQ_WEBHOOK_ALLOW_HOSTS."""
    for url in ("http://127.0.0.1:8000/hook", "http://localhost:8000/hook"):
        resp = alpha.post("/v1/jobs", json={"model": FAKE, "prompt": "hi",
                                            "metadata": {"webhook_url": url}})
        assert_envelope(resp, 400)
        assert resp.json()["error"]["code"] == "invalid_webhook_url"


def test_address_policy() -> None:
    policy = AddressPolicy(["10.1.0.0/16", "hooks.internal"])
    for a in ("8.8.8.8", "2606:4700:4700::1111", "10.1.2.3"):
        ip = literal_ip(a)
        assert ip is not None and policy.address_allowed(ip, "x"), a
    for a in ("10.2.0.1", "127.0.0.1", "169.254.169.254", "::ffff:127.0.0.1", "fd00::1",
              "64:ff9b::7f00:1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"):
        ip = literal_ip(a)
        assert ip is not None and not policy.address_allowed(ip, "x"), a
    ip = literal_ip("192.168.0.9")
    assert ip is not None and policy.address_allowed(ip, "hooks.internal")
    assert not is_public(literal_ip("100.64.0.1"))  # type: ignore[arg-type]


def test_send_time_check_and_pinning(r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process sender on the tests' Redis: (1) an event whose URL turned internal after
    submit (a DNS rebinding; here written straight into the outbox) is refused at send time
    and never reaches the address; (2) the connection goes to the address that was checked
    (the name `rebind.invalid` never resolves: only the pinned address is used), with the
    name in the Host header; (3) an event whose attempts are used up (its senders died
    mid-send) is given up, not sent again."""
    import tokenq.workers.webhooks as wh

    hidden = Receiver("ok", host="127.0.0.2")  # loopback, but not allowlisted
    pinned = Receiver("ok")
    s = Settings(webhook_allow_hosts=["127.0.0.1"], worker={"webhook_max_attempts": 2})
    sender = WebhookSender(r, s)

    def event(eid: str, url: str, attempts: int = 0) -> None:
        r.hset(keys.webhook(eid), mapping={"url": url, "type": "job.succeeded",
                                           "object_id": "job_1", "tenant": "alpha",
                                           "created_at": "1", "attempts": attempts})

    real_resolve = wh.resolve

    async def fake_resolve(policy: AddressPolicy, url: str, timeout_s: float = 5.0) -> Any:
        """`rebind.invalid` resolves (once) to 127.0.0.1; any other lookup of it fails."""
        scheme, host, port, ip = await real_resolve(
            policy, url.replace("rebind.invalid", "127.0.0.1"), timeout_s)
        return scheme, host.replace("127.0.0.1", "rebind.invalid"), port, ip

    monkeypatch.setattr(wh, "resolve", fake_resolve)

    async def run(eid: str) -> None:
        async with httpx.AsyncClient(trust_env=False) as http:
            await sender.deliver(http, eid)

    try:
        event("evt_t1", hidden.url)
        for _ in range(2):
            asyncio.run(run("evt_t1"))
        assert hidden.calls == 0 and r.hget(keys.webhook("evt_t1"), "attempts") == "2"
        port = pinned.server.server_port
        event("evt_t2", f"http://rebind.invalid:{port}/hook")
        asyncio.run(run("evt_t2"))
        assert pinned.calls == 1 and pinned.events[0][0]["host"] == f"rebind.invalid:{port}"
        assert not r.exists(keys.webhook("evt_t2"))  # delivered
        event("evt_t3", pinned.url, attempts=2)
        asyncio.run(run("evt_t3"))
        assert pinned.calls == 1  # not sent a third time
    finally:
        hidden.close()
        pinned.close()
