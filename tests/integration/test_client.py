"""tokenq.client against the real stack (SmolLM2 on llama.cpp): streams resumed across a
connection cut mid-message and across an API replica killed mid-stream deliver every
token exactly once, in order."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import SMOL
from tests.proxy import Proxy
from tokenq.cli.stack import Stack
from tokenq.client import AsyncClient, Client, DoneEvent, TokenEvent
from tokenq.shared.redis_server import free_port

STORY = "Write a long story about a dragon who learns to bake bread. Use many details."


@pytest.fixture
def tq(stack: Stack) -> Iterator[Client]:
    with Client(stack.url) as c:
        yield c


def check_once(c: Client, job_id: str, tokens: list[TokenEvent]) -> None:
    """Indexes 0..n-1 once each, and their text is exactly the job's output."""
    assert [t.index for t in tokens] == list(range(len(tokens)))
    job = c.get(job_id)
    assert job.status == "succeeded"
    assert "".join(t.text for t in tokens) == job.output
    assert job.usage is not None and job.usage.completion_tokens == len(tokens)


def proxy_to(stack: Stack, cut_after: int, cut_times: int = 1) -> Proxy:
    return Proxy((stack.host, stack.port), cut_after=cut_after, cut_times=cut_times).start()


def test_stream_resumes_after_connection_cuts(stack: Stack, tq: Client) -> None:
    """The proxy cuts the first two connections right after an `event: token` line
    (its data line never arrives): the client resumes twice and misses nothing."""
    proxy = proxy_to(stack, cut_after=4, cut_times=2)
    try:
        with Client(proxy.url) as c:
            job = c.submit(SMOL, STORY, max_tokens=48, temperature=0)
            events = list(c.stream(job.id))
            assert c.last_stream is not None and c.last_stream.connections >= 3
    finally:
        proxy.stop()
    assert proxy.cuts == 2
    assert isinstance(events[-1], DoneEvent)
    check_once(tq, job.id, [e for e in events if isinstance(e, TokenEvent)])


def test_stream_moves_to_another_replica(stack: Stack, tq: Client) -> None:
    """Two API processes; the one streaming is SIGKILLed mid-stream; the client goes on
    from the other with Last-Event-ID."""
    port = free_port()
    extra = stack._spawn("api-extra", [sys.executable, "-m", "tokenq.api.server",
                                       "--host", stack.host, "--port", str(port)])
    url = f"http://{stack.host}:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "second API replica did not start"
            time.sleep(0.2)
        with Client([url, stack.url]) as c:
            job = c.submit(SMOL, STORY, max_tokens=160, temperature=0)
            tokens: list[TokenEvent] = []
            for ev in c.stream(job.id):
                if isinstance(ev, TokenEvent):
                    tokens.append(ev)
                    if len(tokens) == 3:
                        extra.send_signal(signal.SIGKILL)
            assert c.last_stream is not None
            assert c.last_stream.urls_tried[0] == url
            assert stack.url in c.last_stream.urls_tried
        assert extra.wait(10) == -signal.SIGKILL
    finally:
        if extra.poll() is None:
            extra.kill()
            extra.wait()
    check_once(tq, job.id, tokens)


def test_async_client_resumes_too(stack: Stack, tq: Client) -> None:
    proxy = proxy_to(stack, cut_after=3)

    async def run() -> tuple[str, list[TokenEvent]]:
        async with AsyncClient(proxy.url) as c:
            job = await c.submit(SMOL, STORY, max_tokens=24, temperature=0)
            toks = [e async for e in c.stream(job.id) if isinstance(e, TokenEvent)]
            final = await c.wait(job.id, timeout=60)
            assert final.done
            return job.id, toks

    try:
        job_id, tokens = asyncio.run(run())
    finally:
        proxy.stop()
    assert proxy.cuts == 1
    check_once(tq, job_id, tokens)


def test_submit_get_wait_cancel(tq: Client) -> None:
    job = tq.submit(SMOL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8,
                    metadata={"t": "client"})
    assert job.status == "queued" and job.stream_url == f"/v1/jobs/{job.id}/events"
    done = tq.wait(job.id, timeout=120)
    assert done.status == "succeeded" and done.metadata == {"t": "client"}
    assert "".join(tq.tokens(job.id)) == done.output  # replay of a finished job
    assert tq.cancel(job.id).status == "succeeded"  # cancel after the end: no change


def test_batch_helpers_report_progress(tq: Client) -> None:
    seen: list[tuple[str, int]] = []
    lines = [{"model": SMOL, "messages": [{"role": "user", "content": f"Count to {n}"}],
              "max_tokens": 6} for n in range(3)]
    b = tq.submit_batch(lines, on_progress=lambda b: seen.append(
        (b.status, b.request_counts.completed)), wait=True)
    assert b.status == "completed" and b.request_counts.completed == 3
    assert seen[-1] == ("completed", 3) and len(seen) >= 2
    results = tq.batch_results(b)
    assert sorted(r["custom_id"] for r in results) == ["request-0", "request-1", "request-2"]
