"""The cluster under test: compose/compose.yml brought up on Docker, driven from the host.

Every request goes to an address of a container this harness started (read with `docker
inspect`) or to the load balancer's port on loopback; faults are Docker's own: `docker kill`
(crash), `docker pause` (a whole-host stall), `docker network disconnect` (a partition).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from tokenq.client.sse import RawEvent, parse_lines
from tokenq.shared import keys as rkeys

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose" / "compose.yml"
PROJECT = "tokenqcluster"
MODEL = "smollm2-135m-instruct"
# A completion prompt the model continues for as long as it is allowed: long jobs on demand.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def sh(*args: str, check: bool = True, timeout: float = 300) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out.stdout.strip()


def wait_for(what: str, cond: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except (httpx.HTTPError, redis.RedisError, RuntimeError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")



def report_figures(tag: str, figures: dict[str, Any]) -> None:
    """Print a module's figures; with TOKENQ_CLUSTER_FIGURES=FILE also append them there,
    one JSON line per run (scripts/cluster_runs.sh gathers several runs that way)."""
    line = json.dumps(figures, sort_keys=True)
    print(f"\n[{tag}] " + line)
    if out := os.environ.get("TOKENQ_CLUSTER_FIGURES"):
        with open(out, "a") as f:
            f.write(line + "\n")

@dataclass
class Cluster:
    env: dict[str, str]
    keys: dict[str, str]  # tenant -> API key
    lb_url: str
    project: str = PROJECT  # the compose project: its containers, network and volumes
    profiles: tuple[str, ...] = ()

    # -- compose and containers --------------------------------------------------------
    def compose(self, *args: str, timeout: float = 600) -> str:
        cmd = ["docker-compose", "-p", self.project, "-f", str(COMPOSE_FILE),
               *(f"--profile={p}" for p in self.profiles), *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **self.env})
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out.stdout.strip()

    def containers(self, service: str, running: bool = True) -> list[str]:
        ids = sh("docker", "ps", *(() if running else ("-a",)), "-q", "--no-trunc",
                 "--filter", f"label=com.docker.compose.project={self.project}",
                 "--filter", f"label=com.docker.compose.service={service}")
        return sorted(ids.split())

    def inspect(self, cid: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(sh("docker", "inspect", cid))[0]
        return doc

    def ip(self, cid: str) -> str:
        nets = self.inspect(cid)["NetworkSettings"]["Networks"]
        return str(nets[self.network]["IPAddress"])

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    def health(self, cid: str) -> str:
        state = self.inspect(cid)["State"]
        return str(state.get("Health", {}).get("Status", state["Status"]))

    def wait_healthy(self, services: list[str], counts: dict[str, int], timeout: float) -> None:
        def all_healthy() -> bool:
            for s in services:
                ids = self.containers(s)
                if len(ids) < counts.get(s, 1):
                    return False
                if any(self.health(c) != "healthy" for c in ids):
                    return False
            return True
        wait_for(f"healthy {services}", all_healthy, timeout, every=1.0)

    def worker_container(self, worker_id: str) -> str:
        """The container whose hostname a worker id (`hostname:pid`) names."""
        host = worker_id.split(":")[0]
        cids = [c for s in ("cpu-worker", "autoscaler") for c in self.containers(s)]
        return next(c for c in cids if c.startswith(host))

    # -- clients -----------------------------------------------------------------------
    def api_urls(self) -> list[str]:
        return [f"http://{self.ip(c)}:8000" for c in self.containers("api")]

    def client(self, base_url: str | None = None, tenant: str = "tenant-a",
               timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=base_url or self.lb_url, timeout=timeout,
                            headers={"Authorization": f"Bearer {self.keys[tenant]}"})

    def redis(self) -> redis.Redis:
        [cid] = self.containers("redis")
        return redis.Redis(host=self.ip(cid), port=6379, password=self.env["REDIS_PASSWORD"],
                           decode_responses=True, socket_timeout=10)

    def live_workers(self) -> dict[str, dict[str, Any]]:
        """Heartbeats younger than the worker TTL, by worker id."""
        r = self.redis()
        try:
            now, ttl = time.time(), float(self.env["TOKENQ_WORKER_TTL_S"])
            out: dict[str, dict[str, Any]] = {}
            for wid, raw in r.hgetall(rkeys.WORKERS).items():
                info = json.loads(raw)
                if now - float(info.get("ts", 0)) < ttl:
                    out[str(wid)] = info
            return out
        finally:
            r.close()

    def fixed_workers(self) -> set[str]:
        hosts = {c[:12] for c in self.containers("cpu-worker")}
        return {w for w in self.live_workers() if w.split(":")[0] in hosts}


# -- jobs, streams and the history checker ---------------------------------------------
def submit(client: httpx.Client, max_tokens: int, prompt: str = COUNTING,
           **extra: Any) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            **extra}
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.text
    job_id: str = resp.json()["id"]
    return job_id


def events(client: httpx.Client, job_id: str, last_event_id: str | None = None,
           timeout: float = 120) -> Iterator[RawEvent]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                       timeout=httpx.Timeout(timeout, connect=5)) as resp:
        resp.raise_for_status()
        yield from parse_lines(resp.iter_lines())


@dataclass
class Reader:
    """One client's view of one job: every event it was given, across reconnects."""

    job_id: str
    seen: list[RawEvent] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each of `seen` arrived (monotonic)
    walls: list[float] = field(default_factory=list)  # the same, by the wall clock
    connections: int = 0
    marks: dict[str, float] = field(default_factory=dict)  # name -> monotonic time

    @property
    def last_id(self) -> str | None:
        return self.seen[-1].id if self.seen else None

    @property
    def tokens(self) -> list[RawEvent]:
        return [e for e in self.seen if e.event == "token"]

    @property
    def done(self) -> bool:
        return bool(self.seen) and self.seen[-1].event in ("done", "error", "cancelled")

    def read(self, client: httpx.Client, until: Callable[[Reader], bool] | None = None,
             timeout: float = 120) -> bool:
        """Read from where this reader stopped; True at a terminal event, False when `until`
        said stop. A broken connection raises (httpx.TransportError): resume elsewhere."""
        self.connections += 1
        for ev in events(client, self.job_id, self.last_id, timeout):
            self.seen.append(ev)
            self.times.append(time.monotonic())
            self.walls.append(time.time())
            if ev.event == "token" and "first_token" not in self.marks:
                self.marks["first_token"] = time.monotonic()
            if ev.event == "started" and ev.data["attempt"] > 1:
                self.marks.setdefault("takeover_started", time.monotonic())
            if ev.event == "token" and "takeover_started" in self.marks:
                self.marks.setdefault("takeover_token", time.monotonic())
            if self.done:
                return True
            if until is not None and until(self):
                return False
        return self.done

    def read_resuming(self, clients: list[httpx.Client], timeout: float = 180,
                      idle_s: float = 10) -> None:
        """Read to the end, moving to the next client (API replica) when one fails or goes
        silent for `idle_s` (the API pings idle streams more often: a replica that died with
        the connection open sends nothing, not even a reset)."""
        deadline = time.monotonic() + timeout
        i = 0
        while not self.done:
            assert time.monotonic() < deadline, f"{self.job_id}: no terminal event in time"
            try:
                self.read(clients[i % len(clients)], timeout=idle_s)
            except (httpx.TransportError, httpx.HTTPStatusError):
                i += 1
                time.sleep(0.2)


def check_history(client: httpx.Client, readers: list[Reader],
                  accepted: list[str]) -> dict[str, Any]:
    """The guarantees over everything that happened: each accepted job ends in exactly one
    terminal state; each client's stream is contiguous from index 0 (no gap, no duplicate)
    and ends with one terminal event; the record's output is the stream's text; the stored
    stream, read again from the start, holds the same (nothing fenced-off leaked in)."""
    summary = {"jobs": len(accepted), "lost": 0, "duplicated": 0, "gaps": 0}
    by_job = {r.job_id: r for r in readers}
    for job_id in accepted:
        rec = client.get(f"/v1/jobs/{job_id}").json()
        if rec.get("status") not in ("succeeded", "failed", "cancelled", "expired"):
            summary["lost"] += 1
            continue
        stored = list(events(client, job_id))
        terminal = [e for e in stored if e.event in ("done", "error", "cancelled")]
        assert len(terminal) == 1 and stored[-1] is terminal[0], (job_id, terminal)
        for view in ([stored] + ([by_job[job_id].seen] if job_id in by_job else [])):
            idx = [e.data["index"] for e in view if e.event == "token"]
            summary["duplicated"] += len(idx) - len(set(idx))
            summary["gaps"] += int(idx != list(range(len(idx))))
            if rec["status"] == "succeeded":
                assert rec["output"] == "".join(e.data["text"] for e in view
                                                if e.event == "token"), job_id
                assert rec["usage"]["completion_tokens"] == len(idx), job_id
    assert summary["lost"] == summary["duplicated"] == summary["gaps"] == 0, summary
    return summary
