"""`tokenq bench scale`: what its parts share. A CPU meter per process (what bounds a
part), percentiles, Redis' used_memory, and a lean keep-alive HTTP/1.1 client for request
rates: httpx spends several times the API's own CPU per request, so with it a 2-core
machine measures the client, not the API; and the client's garbage collector kept out of
what it measures."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psutil
import redis

WHY = {"api": "its one event loop", "redis": "Redis runs commands on one thread",
       "worker": "one Celery worker process and its GIL",
       "bench": "the load generator itself", "source": "the synthetic token source"}
MACHINE = "machine"  # every process on the host, ours and others'


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """This client's own cyclic garbage collector stopped while it measures. One process
    holds all the bench's streams (1,000 httpx streams and their parsers), so each of
    its collections stopped every stream's reading at once and the pause was counted as
    the server's latency: on the 2-core VM a full collection took 325 ms and was the p99
    (docs/benchmarks.md, "The queue itself"). A real client is one stream per process.
    What start-up built is frozen out of reach; garbage in cycles waits for the end."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


class Meter:
    """CPU seconds of each process of the stack (and this one), and of the whole machine."""

    def __init__(self) -> None:
        self.procs: dict[str, psutil.Process] = {"bench": psutil.Process()}

    def add(self, name: str, pid: int | None) -> None:
        if pid is not None:
            self.procs[name] = psutil.Process(pid)

    def snap(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            try:
                t = p.cpu_times()
                out[name] = t.user + t.system
            except psutil.Error:
                out[name] = 0.0
        m = psutil.cpu_times()
        out[MACHINE] = sum(getattr(m, f, 0.0) for f in (
            "user", "nice", "system", "irq", "softirq", "steal"))
        return out

    @staticmethod
    def cores(a: dict[str, float], b: dict[str, float], wall: float) -> dict[str, float]:
        return {k: (b[k] - a.get(k, 0.0)) / max(wall, 1e-9) for k in b}


def bound(cores: dict[str, float]) -> str:
    """Cores each process used over a part, and what bounded it: a process near one full
    core, else the machine's cores (busy with our processes and others'), else waits."""
    ours = {k: v for k, v in cores.items() if k != MACHINE}
    used = ", ".join(f"{k} {v:.2f}" for k, v in sorted(ours.items(), key=lambda kv: -kv[1]))
    n = psutil.cpu_count() or 1
    busy = cores.get(MACHINE, sum(ours.values()))
    others = max(0.0, busy - sum(ours.values()))
    top = max(ours, key=lambda k: ours[k])
    if ours[top] >= 0.85:
        why = f"the {top} process at a full core ({WHY.get(top, top)})"
    elif busy >= 0.8 * n:
        why = (f"the machine's {n} cores, all busy ({others:.2f} of them other processes'; "
               f"of ours the {top} process works most: {WHY.get(top, top)})")
    else:
        why = "no process at a full core and cores to spare: round trips and waits"
    return f"CPU (cores) {used}; machine {busy:.2f} of {n} -> bound: {why}"


def used_memory(r: redis.Redis) -> int:
    info: dict[str, Any] = r.info("memory")
    return int(info["used_memory"])


def command_stats(r: redis.Redis) -> tuple[float, dict[str, tuple[int, int]]]:
    """Now, and Redis' calls and microseconds so far per command (`INFO commandstats`)."""
    info: dict[str, Any] = r.info("commandstats")
    return time.monotonic(), {k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
                              for k, v in info.items() if isinstance(v, dict)}


def command_costs(a: tuple[float, dict[str, tuple[int, int]]],
                  b: tuple[float, dict[str, tuple[int, int]]],
                  top: int = 3, always: tuple[str, ...] = ("xread", "publish")
                  ) -> dict[str, dict[str, float]]:
    """The `top` commands by Redis time between two `command_stats`, and those named in
    `always` that ran: calls a second, microseconds a call, and the share of Redis' one
    core they took."""
    wall = max(b[0] - a[0], 1e-9)
    out: dict[str, dict[str, float]] = {}
    for cmd, (calls, usec) in b[1].items():
        calls0, usec0 = a[1].get(cmd, (0, 0))
        if calls > calls0:
            out[cmd] = {"per_s": (calls - calls0) / wall,
                        "us_per_call": (usec - usec0) / (calls - calls0),
                        "cores": (usec - usec0) / 1e6 / wall}
    ranked = sorted(out.items(), key=lambda kv: -kv[1]["cores"])
    return {k: v for i, (k, v) in enumerate(ranked) if i < top or k in always}


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               request: bytes) -> tuple[int, bytes, bool]:
    writer.write(request)
    status = int((await reader.readline()).split()[1])
    length, close = 0, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "connection" and "close" in value.lower():
            close = True
    return status, await reader.readexactly(length), close


async def _requests(url: str, key: str, method: str, paths: list[str],
                    body: dict[str, Any] | None, concurrency: int,
                    limit_s: float) -> tuple[list[str], Counter[str], float]:
    """Send each request once over `concurrency` keep-alive connections: the ids answered,
    a count per status code (or error name) and the wall time."""
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80
    data = json.dumps(body).encode() if body is not None else b""
    head = (f"Host: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    ids: list[str] = []
    codes: Counter[str] = Counter()
    todo: Iterator[str] = iter(paths)
    deadline = time.monotonic() + limit_s

    async def lane() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for path in todo:
            if time.monotonic() > deadline:
                codes["not_sent"] += 1
                continue
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
                status, got, close = await asyncio.wait_for(_one(
                    *conn, f"{method} {path} HTTP/1.1\r\n{head}".encode() + data), 60)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError,
                    IndexError) as exc:
                codes[type(exc).__name__] += 1
                close = True
            else:
                codes[str(status)] += 1
                if status < 300:
                    ids.append(json.loads(got)["id"])
            if close and conn is not None:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return ids, codes, time.perf_counter() - t0


def send(url: str, key: str, method: str, paths: list[str], body: dict[str, Any] | None,
         concurrency: int, limit_s: float = 300.0) -> tuple[list[str], Counter[str], float]:
    return asyncio.run(_requests(url, key, method, paths, body, concurrency, limit_s))


def post_jobs(url: str, key: str, model: str, n: int, concurrency: int,
              max_tokens: int = 16) -> tuple[list[str], Counter[str], float]:
    body = {"model": model, "prompt": "scale bench job", "max_tokens": max_tokens}
    return send(url, key, "POST", ["/v1/jobs"] * n, body, concurrency)
