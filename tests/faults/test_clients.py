"""Clients that go away or stop reading: the engine slot is freed, nobody else waits."""

from __future__ import annotations

import itertools
import socket
import threading
import time

import httpx
import redis

from tests.faults.conftest import KEYS
from tests.faults.harness import check_exactly_once, submit, wait_terminal
from tokenq.cli.stack import Stack
from tokenq.client.sse import RawEvent, stream_events
from tokenq.shared import keys


def read_tokens(client: httpx.Client, path: str, n: int) -> float:
    """Open the stream, read `n` token events, drop the connection; returns when."""
    with client.stream("GET", path, timeout=30) as resp:
        seen = 0
        for line in resp.iter_lines():
            seen += line == "event: token"
            if seen == n:
                return time.monotonic()
    raise AssertionError("stream ended early")


def test_interactive_disconnect_frees_the_slot(alpha: httpx.Client,
                                               secure_redis: redis.Redis) -> None:
    job_id = submit(alpha, 1, 400)[0]  # 10 s at 40 tok/s
    left_at = read_tokens(alpha, f"/v1/jobs/{job_id}/events?cancel_on_disconnect=true", 5)
    while secure_redis.hget(keys.job(job_id), "state") == "running":
        assert time.monotonic() - left_at < 10, "the job kept running"
        time.sleep(0.02)
    freed_s = time.monotonic() - left_at
    assert secure_redis.hget(keys.job(job_id), "state") == "cancelled"
    assert freed_s <= 2.0, freed_s
    print(f"\n[faults] interactive client disconnected: job cancelled, slot freed "
          f"in {freed_s * 1000:.0f} ms")


def test_native_disconnect_keeps_the_job_for_resume(alpha: httpx.Client,
                                                    secure_redis: redis.Redis) -> None:
    """The other half of the decision: a plain native stream is resumable, so leaving
    does not cancel; the client comes back with Last-Event-ID and gets the rest."""
    job_id = submit(alpha, 1, 60)[0]
    last: RawEvent | None = None
    for ev in stream_events(alpha, job_id, timeout=30):
        last = ev
        if ev.event == "token" and ev.data["index"] == 9:
            break
    assert last is not None and last.id
    rest = list(stream_events(alpha, job_id, last_event_id=last.id, timeout=60))
    assert rest[-1].event == "done"
    assert [e.data["index"] for e in rest if e.event == "token"] == list(range(10, 60))
    check_exactly_once(secure_redis, [job_id], 60)


def test_frozen_client_is_dropped_and_others_are_unaffected(
        secure_stack: Stack, alpha: httpx.Client, secure_redis: redis.Redis) -> None:
    # ~9.6 MB of events: more than any socket buffers between the API and a client.
    big = submit(alpha, 1, 150, prompt="[[pad=65536]]")[0]
    other = submit(alpha, 1, 120)[0]  # 3 s at 40 tok/s, streamed by a healthy client
    frozen = socket.socket()
    frozen.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    frozen.connect(("127.0.0.1", secure_stack.port))
    frozen.sendall(f"GET /v1/jobs/{big}/events HTTP/1.1\r\nHost: x\r\n"
                   f"Authorization: Bearer {KEYS['alpha']}\r\n\r\n".encode())
    stamps: list[float] = []
    healthy: list[RawEvent] = []

    def follow() -> None:
        for ev in stream_events(alpha, other, timeout=60):
            healthy.append(ev)
            stamps.append(time.monotonic())

    t = threading.Thread(target=follow)
    t.start()
    t.join(60)
    wait_terminal(secure_redis, [big], timeout=60)
    time.sleep(2 + 2)  # the 2 s send timeout, and margin
    # The frozen client now reads: whatever was buffered, then the server's close.
    frozen.settimeout(10)
    got = bytearray()
    while chunk := frozen.recv(1 << 20):
        got += chunk
    frozen.close()
    assert b"event: done" not in got and len(got) < 9_000_000, len(got)
    # The healthy stream was whole and never stalled behind the frozen one.
    assert healthy[-1].event == "done"
    assert [e.data["index"] for e in healthy if e.event == "token"] == list(range(120))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert max(gaps) < 1.0, max(gaps)
    print(f"\n[faults] frozen SSE client dropped after the 2 s send timeout "
          f"({len(got) / 1e6:.1f} of 9.8 MB delivered); the other stream's max gap "
          f"{max(gaps) * 1000:.0f} ms")
