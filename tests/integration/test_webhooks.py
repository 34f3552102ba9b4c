"""Completion webhooks: sent by workers from the Redis outbox, signed, retried."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import SMOL, WEBHOOK_SECRET
from tests.integration.test_openai_batches import chat_line, jsonl, wait_status
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.webhook_policy import tenant_secret
from tokenq.workers.webhooks import verify

# Without API keys every caller is tenant `default`: its secret is derived from the
# stack's TOKENQ_WORKER__WEBHOOK_SECRET.
DEFAULT_SECRET = tenant_secret(Settings(worker={"webhook_secret": WEBHOOK_SECRET}), "default") or ""


class Receiver:
    """A local endpoint that answers 500 to the first `fail_first` deliveries, each answer
    after `delay_s`."""

    def __init__(self, fail_first: int = 0, delay_s: float = 0.0):
        self.events: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                time.sleep(delay_s)
                outer.calls += 1
                ok = outer.calls > outer.fail_first
                if ok:
                    outer.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200 if ok else 500)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.time() + timeout
        while len(self.events) < n:
            assert time.time() < deadline, (self.calls, self.events)
            time.sleep(0.1)
        out = []
        for headers, body in self.events:
            assert verify(DEFAULT_SECRET, headers, body), headers
            out.append(json.loads(body))
        return out


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rcv = Receiver(fail_first=1)
    yield rcv
    rcv.server.shutdown()


def test_job_and_batch_webhooks_are_signed_and_retried(
        stack: Stack, client: httpx.Client, receiver: Receiver) -> None:
    job = client.post("/v1/jobs", json={
        "model": SMOL, "prompt": "Hi", "max_tokens": 4,
        "metadata": {"webhook_url": receiver.url}}).json()
    (event,) = receiver.wait(1)
    assert receiver.calls == 2  # the first delivery got a 500 and was retried
    assert event["type"] == "job.succeeded" and event["data"] == {"id": job["id"]}
    assert event["object"] == "event" and event["id"].startswith("evt_")

    with openai.OpenAI(base_url=stack.url + "/v1", api_key="x", max_retries=0) as oai:
        f = oai.files.create(file=("w.jsonl", jsonl([chat_line("a", "hi"), chat_line("b", "yo")])),
                             purpose="batch")
        b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                               completion_window="24h", metadata={"webhook_url": receiver.url})
        wait_status(oai, b.id, {"completed"})
    events = receiver.wait(2)
    assert events[1]["type"] == "batch.completed" and events[1]["data"] == {"id": b.id}
    time.sleep(1.5)
    assert len(receiver.events) == 2  # delivered once each, batch lines send none


def test_signature_rejects_tampering() -> None:
    from tokenq.workers.webhooks import sign

    ts = int(time.time())
    body = b'{"id":"evt_1"}'
    headers = {"webhook-id": "evt_1", "webhook-timestamp": str(ts),
               "webhook-signature": sign(WEBHOOK_SECRET, "evt_1", ts, body)}
    assert verify(WEBHOOK_SECRET, headers, body)
    assert not verify(WEBHOOK_SECRET, headers, body + b" ")
    assert not verify(DEFAULT_SECRET, headers, body)
    assert not verify(WEBHOOK_SECRET, {**headers, "webhook-timestamp": str(ts - 3600)}, body)
