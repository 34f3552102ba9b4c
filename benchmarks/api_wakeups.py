"""The API's wake-ups and CPU: idle, then with N streams of queued jobs open.

On a small VM each wake-up of a Python process costs CPU out of proportion to what it
does; this counts them. An API on its own embedded Redis, no worker (its jobs
stay queued, so each open stream waits for its job: `queued` updates and keep-alive
timers); Linux only (/proc). Usage:
    .venv/bin/python benchmarks/api_wakeups.py [--streams 200] [--window 20] [--windows 3]
Prints, per window, the API process's wake-ups a second (voluntary context switches of
its threads) and its CPU in cores (scheduler run time, /proc/<pid>/task/*/schedstat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from tokenq.cli.stack import Stack
from tokenq.shared.settings import Settings

MODEL = "wakeups-m"


def sample(pid: int) -> tuple[float, int]:
    """(CPU seconds, wake-ups) of every thread of the process so far."""
    cpu_ns = wakeups = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu_ns += int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        wakeups += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return cpu_ns / 1e9, wakeups


async def windows(pid: int, label: str, seconds: float, count: int) -> None:
    for _ in range(count):
        (c0, w0), t0 = sample(pid), time.monotonic()
        await asyncio.sleep(seconds)
        (c1, w1), dt = sample(pid), time.monotonic() - t0
        print(f"{label}: {(w1 - w0) / dt:7.1f} wake-ups/s  {(c1 - c0) / dt:.4f} cores",
              flush=True)


async def measure(url: str, pid: int, streams: int, seconds: float, count: int) -> None:
    await asyncio.sleep(3)  # past the start-up work
    await windows(pid, "idle", seconds, count)
    if not streams:
        return
    limits = httpx.Limits(max_connections=streams + 8)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        ids = []
        for _ in range(streams):
            resp = await client.post("/v1/jobs", json={"model": MODEL, "prompt": "hi"})
            resp.raise_for_status()
            ids.append(resp.json()["id"])

        async def follow(job_id: str) -> None:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events") as resp:
                async for _ in resp.aiter_lines():
                    pass

        tasks = []
        for job_id in ids:  # opened over a few seconds, as clients arrive
            tasks.append(asyncio.create_task(follow(job_id)))
            await asyncio.sleep(0.01)
        await asyncio.sleep(3)
        await windows(pid, f"{streams} queued streams", seconds, count)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--window", type=float, default=20.0, help="seconds per window")
    ap.add_argument("--windows", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokenq-wakeups-") as tmp:
        state = Path(tmp)
        (state / "models.json").write_text(json.dumps({MODEL: {"backend": "fake"}}))
        room = str(args.streams + 50)
        stack = Stack(Settings(redis_url=None, state_dir=state,
                               models_file=state / "models.json"),
                      models=[MODEL], quiet=True, scratch_redis=True,
                      env={"TOKENQ_API__MAX_STREAMS_PER_TENANT": room,
                           "TOKENQ_API__TENANT_MAX_QUEUED": room,
                           "TOKENQ_API__QUEUE_LIMIT": room})
        stack.start_parts(worker_models=[])
        try:
            stack.wait_ready(timeout=180, models=[])
            assert stack.api is not None
            asyncio.run(measure(stack.url, stack.api.pid, args.streams, args.window,
                                args.windows))
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
