"""An API replica's timers wake it a few times a second, not tens: on a small VM each wake-up
of a Python process costs CPU out of proportion to what it does (docs/benchmarks.md, "The
API's timers").
- Idle: uvicorn's own loop woke it 10 times a second and the catalogue's poll 4 more
  (api/server.py's tick, api/models_admin.py's poll).
- With streams open: each stream's timers (its `queued` updates, its keep-alive watcher)
  fired on their own phase; they fall on a shared grid now (api/sse.py `on_grid`).
And a SIGTERM still ends an idle replica at once, not at its next tick."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="counts wake-ups in Linux /proc")

MODEL = "wake-m"  # no worker serves it: its jobs stay queued
STREAMS = 200
WINDOW_S = 5.0
# Idle: ~17 wake-ups a second before, ~3 now (measured); room for a busy CI host.
MAX_IDLE_PER_S = 8.0
# 200 queued streams opened one after another: each stream's once-a-second update on its
# own phase woke it 202-245 times a second; on the grid 4-7 (measured). The bound leaves
# room for a host where the replies to the 200 updates come back in more reads than here.
MAX_STREAMS_PER_S = 40.0


def _wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of the process: its wake-ups."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        n += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return n


def _rate(pid: int, bound: float, within_s: float = 30.0) -> float:
    """The process's wake-ups a second over WINDOW_S, measured again while over `bound`,
    for at most `within_s`: what it settles to, not a burst as streams open or close."""
    deadline = time.monotonic() + within_s
    while True:
        before, t0 = _wakeups(pid), time.monotonic()
        time.sleep(WINDOW_S)
        rate = (_wakeups(pid) - before) / (time.monotonic() - t0)
        if rate < bound or time.monotonic() > deadline:
            return rate


@pytest.fixture(scope="module")
def lone_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An API on its own Redis, no worker (nothing else wakes it)."""
    state = tmp_path_factory.mktemp("idle")
    (state / "models.json").write_text(json.dumps({MODEL: {"backend": "fake"}}))
    room = str(STREAMS + 50)
    stack = Stack(Settings(redis_url=None, state_dir=state, models_file=state / "models.json"),
                  models=[MODEL], quiet=True, scratch_redis=True,
                  env={"TOKENQ_API__MAX_STREAMS_PER_TENANT": room,
                       "TOKENQ_API__TENANT_MAX_QUEUED": room, "TOKENQ_API__QUEUE_LIMIT": room})
    stack.start_parts(worker_models=[])
    stack.wait_ready(timeout=180, models=[])
    try:
        yield stack
    finally:
        stack.stop()


def test_queued_streams_wake_the_api_together(lone_api: Stack) -> None:
    assert lone_api.api is not None
    pid = lone_api.api.pid
    rate: list[float] = []

    async def run() -> None:
        async with httpx.AsyncClient(base_url=lone_api.url, timeout=60,
                                     limits=httpx.Limits(max_connections=STREAMS + 8)) as c:
            ids = []
            for _ in range(STREAMS):
                resp = await c.post("/v1/jobs", json={"model": MODEL, "prompt": "hi"})
                assert resp.status_code in (200, 201, 202), resp.text
                ids.append(resp.json()["id"])

            async def follow(job_id: str, first: asyncio.Event) -> None:
                async with c.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
                    assert resp.status_code == 200
                    async for line in resp.aiter_lines():
                        if line.startswith("event:"):  # its `queued`: the stream is open
                            first.set()

            tasks = []
            for j in ids:  # one after another: their timers' phases spread over the opening
                first = asyncio.Event()
                tasks.append(asyncio.create_task(follow(j, first)))
                waiter = asyncio.ensure_future(first.wait())
                await asyncio.wait({tasks[-1], waiter}, timeout=60,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if tasks[-1].done():
                    tasks[-1].result()  # its failure
                assert first.is_set(), f"{len(tasks)}th stream not open within 60 s"
            # every stream's timers run now; one window (left alone, their phases drift
            # together over tens of seconds, which would hide the defect this guards)
            rate.append(await asyncio.to_thread(_rate, pid, MAX_STREAMS_PER_S, 0.0))
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    assert rate[-1] < MAX_STREAMS_PER_S, \
        f"{STREAMS} queued streams woke the API {rate[-1]:.1f} times a second"


def test_idle_api_wakes_rarely_and_exits_at_once(lone_api: Stack) -> None:
    proc = lone_api.api
    assert proc is not None
    rate = _rate(proc.pid, MAX_IDLE_PER_S)  # (once the streams of the test before are gone)
    assert rate < MAX_IDLE_PER_S, f"an idle API woke {rate:.1f} times a second"

    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # no stream open: no drain to wait for
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM)
    took = time.monotonic() - sent
    # uvicorn's shutdown takes ~0.2 s here; the bound is for a slow host
    assert took < 10, f"the idle API took {took:.1f} s to exit"
