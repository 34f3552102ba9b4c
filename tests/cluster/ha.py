"""compose/compose.yml's profile `ha` under load: which node is master (as the sentinels
say), and the steady load the failover scenarios run under (streams being read, a batch in
progress, a loop of POSTs), each bounded in count and time, checked with the harness'
history checker at the end."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis

from tests.cluster.harness import MODEL, Cluster, Reader, check_history, sh, submit, wait_for

HA_PROJECT = "tokenqha"
MASTER = "tokenq"  # not the default `mymaster`, so the setting is exercised
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
NODES = ("redis", "redis-replica-1", "redis-replica-2")
HA_SERVICES = [*NODES, *SENTINELS, "api", "cpu-worker"]
HA_ENV = {
    "REDIS_MASTER_NAME": MASTER,
    "TOKENQ_REDIS_SENTINELS": ",".join(f"{s}:26379" for s in SENTINELS),
    "TOKENQ_API__DURABLE_REPLICAS": "1",
    "REDIS_MIN_REPLICAS": "1",
    # Short, so that each fault plays out in seconds (compose's defaults: 5 s, 60 s, 10 s).
    "REDIS_DOWN_AFTER_MS": "2000", "REDIS_FAILOVER_TIMEOUT_MS": "10000",
    "REDIS_MIN_REPLICAS_MAX_LAG": "5",
}
STREAMS = 3
STREAM_TOKENS = 120  # still running when the fault lands, and after the failover
BATCH_LINES = 6
POST_EVERY_S = 1.0
MAX_POSTS = 480  # the POST loop's bound besides its deadline


def service_of(c: Cluster, cid: str) -> str:
    return str(c.inspect(cid)["Config"]["Labels"]["com.docker.compose.service"])


def container(c: Cluster, service: str, running: bool = True) -> str:
    [cid] = c.containers(service, running=running)
    return cid


def sentinel(c: Cluster, service: str) -> redis.Redis:
    return redis.Redis(host=c.ip(container(c, service)), port=26379,
                       password=c.env["REDIS_SENTINEL_PASSWORD"], decode_responses=True,
                       socket_timeout=3, socket_connect_timeout=3)


def master(c: Cluster) -> str:
    """The master's service name as most running sentinels give it (they announce hostnames);
    '' while they disagree or none answers."""
    votes: Counter[str] = Counter()
    for s in SENTINELS:
        if not c.containers(s):
            continue
        try:
            cl = sentinel(c, s)
            try:
                got = cl.sentinel_get_master_addr_by_name(MASTER)
            finally:
                cl.close()
        except (redis.RedisError, ValueError):
            continue
        if got:
            votes[str(got[0])] += 1  # type: ignore[index]
    top = votes.most_common(1)
    return top[0][0] if top and top[0][1] >= 2 else ""


def node(c: Cluster, service: str) -> redis.Redis:
    return redis.Redis(host=c.ip(container(c, service)), port=6379,
                       password=c.env["REDIS_PASSWORD"], decode_responses=True,
                       socket_timeout=3, socket_connect_timeout=3)


def replicated(c: Cluster) -> bool:
    """Every node up: the sentinels' master has the other two as replicas, links up."""
    m = master(c)
    if m not in NODES:
        return False
    for other in (n for n in NODES if n != m):
        if not c.containers(other):
            return False
        cl = node(c, other)
        try:
            info = cl.info("replication")
        finally:
            cl.close()
        if not (info.get("role") == "slave" and info.get("master_host") == m
                and info.get("master_link_status") == "up"):
            return False
    return True


def refuses_writes(c: Cluster, service: str) -> bool:
    """A write on `service` from inside its own container (it may be cut off from the
    network) is refused: NOREPLICAS (min-replicas-to-write) or READONLY."""
    out = sh("docker", "exec", container(c, service), "redis-cli", "SET",
             "tokenq-ha-probe", "1", check=False, timeout=30)
    return out.startswith(("NOREPLICAS", "READONLY"))


@dataclass
class PostLoop:
    """POSTs a short job every POST_EVERY_S, alternating the API replicas, until stopped,
    MAX_POSTS or `limit_s`: what each got, and when."""

    c: Cluster
    limit_s: float = 480
    results: list[tuple[float, int, str]] = field(default_factory=list)  # (t, status, id)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> PostLoop:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        urls = self.c.api_urls()
        clients = [self.c.client(u, timeout=10) for u in urls]
        deadline = time.monotonic() + self.limit_s
        try:
            for i in range(MAX_POSTS):
                if self.stop.is_set() or time.monotonic() > deadline:
                    return
                body = {"model": MODEL, "prompt": f"Say {i} in words:", "max_tokens": 4,
                        "temperature": 0}
                t = time.monotonic()
                try:
                    resp = clients[i % len(clients)].post("/v1/jobs", json=body)
                    status = resp.status_code
                    job = resp.json().get("id", "") if status == 202 else ""
                except httpx.HTTPError:
                    status, job = 0, ""
                self.results.append((t, status, job))
                self.stop.wait(POST_EVERY_S)
        finally:
            for cl in clients:
                cl.close()

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    @property
    def accepted(self) -> list[str]:
        return [j for _, s, j in self.results if s == 202]

    def first_202_after(self, t0: float) -> float | None:
        return next((t for t, s, _ in self.results if t > t0 and s == 202), None)


def batch_ended(main: httpx.Client, batch: str | None) -> dict[str, Any] | None:
    """The batch once it has ended (None before). A 503 (the job store unavailable for the
    moment, as while a failover settles: a terminal batch's read registers its files, a
    write) is retried; anything else but a 200 fails the check with its body."""
    resp = main.get(f"/v1/batches/{batch}")
    if resp.status_code == 503:
        return None
    assert resp.status_code == 200, (resp.status_code, resp.text)
    b: dict[str, Any] = resp.json()
    return b if b["status"] in ("completed", "failed", "expired", "cancelled") else None


@dataclass
class Load:
    """Streams being read on both API replicas, a batch in progress, a POST loop."""

    c: Cluster
    readers: list[Reader] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    clients: list[httpx.Client] = field(default_factory=list)
    posts: PostLoop | None = None
    batch: str = ""

    def start(self) -> Load:
        urls = self.c.api_urls()
        self.clients = [self.c.client(u) for u in urls]
        main = self.clients[0]
        jobs = [submit(main, max_tokens=STREAM_TOKENS) for _ in range(STREAMS)]
        self.readers = [Reader(j) for j in jobs]
        self.threads = [threading.Thread(target=rd.read_resuming,
                                         args=(self.clients[i % 2:] + self.clients[:i % 2], 300),
                                         daemon=True)
                        for i, rd in enumerate(self.readers)]
        for t in self.threads:
            t.start()
        self.batch = self._start_batch(main)
        self.posts = PostLoop(self.c).start()
        wait_for("every stream running", lambda: all(len(r.tokens) >= 5 for r in self.readers),
                 120, every=0.2)
        wait_for("a few POSTs accepted", lambda: len(self.posts.accepted) >= 3, 60)  # type: ignore[union-attr]
        return self

    def _start_batch(self, c: httpx.Client) -> str:
        lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": f"Name a colour ({i})."}]}}
                 for i in range(BATCH_LINES)]
        data = "\n".join(json.dumps(x) for x in lines).encode()
        f = c.post("/v1/files", files={"file": ("lines.jsonl", data)},
                   data={"purpose": "batch"})
        assert f.status_code == 200, f.text
        b = c.post("/v1/batches", json={"input_file_id": f.json()["id"],
                                        "endpoint": "/v1/chat/completions",
                                        "completion_window": "24h"})
        assert b.status_code == 200, b.text
        return str(b.json()["id"])

    def resumed_s(self, t0: float) -> float:
        """Seconds from t0 until every stream still running at t0 had a token after it."""
        firsts = []
        for rd in self.readers:
            ended = any(t <= t0 and e.event in ("done", "error", "cancelled")
                        for t, e in zip(rd.times, rd.seen, strict=True))
            if not ended:
                after = [t for t, e in zip(rd.times, rd.seen, strict=True)
                         if t > t0 and e.event == "token"]
                assert after, f"{rd.job_id}: no token after the fault"
                firsts.append(after[0])
        return round(max(firsts) - t0, 2) if firsts else 0.0

    def delivery_s(self, since_wall: float) -> float:
        """The longest a token of the streams still running waited between being written
        (its entry id: Redis' clock, the host's) or `since_wall`, whichever is later, and
        reaching its client: the API's part of a resume, whatever the workers did."""
        worst = 0.0
        for rd in self.readers:
            for wall, e in zip(rd.walls, rd.seen, strict=True):
                if e.event == "token" and e.id and wall > since_wall:
                    written = int(e.id.partition("-")[0]) / 1000
                    worst = max(worst, wall - max(written, since_wall))
        return round(worst, 2)

    def finish(self, t0: float) -> dict[str, Any]:
        """Stop the POSTs, read every stream to its end, wait for every accepted job and the
        batch, check the history. The figures: the checker's, the POSTs' statuses, when the
        last accepted job ended (from t0, the fault)."""
        assert self.posts is not None
        self.posts.finish()
        for t in self.threads:
            t.join(320)
        main = self.clients[0]
        accepted = [r.job_id for r in self.readers] + self.posts.accepted

        def all_ended() -> bool:
            return all(main.get(f"/v1/jobs/{j}").json().get("status") in (
                "succeeded", "failed", "cancelled", "expired") for j in accepted)
        wait_for("every accepted job ended", all_ended, 240, every=1)
        ended = time.monotonic()
        summary = check_history(main, self.readers, accepted)
        final = wait_for("the batch ended", lambda: batch_ended(main, self.batch), 240, every=1)
        assert final["status"] == "completed", final
        out = main.get(f"/v1/files/{final['output_file_id']}/content").text.splitlines()
        ids = sorted(json.loads(x)["custom_id"] for x in out)
        assert ids == sorted(f"line-{i}" for i in range(BATCH_LINES)), (
            ids, final, self._missing(main, final, ids))  # each once
        statuses = Counter(s for _, s, _ in self.posts.results)
        assert set(statuses) <= {202, 503, 0}, statuses  # never a 500, nor a 4xx
        succeeded = sum(1 for j in accepted
                        if main.get(f"/v1/jobs/{j}").json()["status"] == "succeeded")
        for cl in self.clients:
            cl.close()
        return {**summary, "succeeded": succeeded, "batch_lines": len(ids),
                "posts_202": statuses[202], "posts_503": statuses[503],
                "posts_failed": statuses[0], "all_ended_s": round(ended - t0, 2),
                "max_token_gap_s": self.max_token_gap()}

    def _missing(self, main: httpx.Client, final: dict[str, Any],
                 ids: list[str]) -> list[Any]:
        """What became of the lines missing from the output: the batch's error file lines
        and each missing line's job record (status, error, attempts)."""
        errs = []
        if final.get("error_file_id"):
            errs = main.get(f"/v1/files/{final['error_file_id']}/content").text.splitlines()
        got = []
        for i in range(BATCH_LINES):
            if f"line-{i}" not in ids:
                job = f"job_{self.batch.removeprefix('batch_')}_{i + 1}"
                rec = main.get(f"/v1/jobs/{job}").json()
                got.append({k: rec.get(k) for k in ("id", "status", "error", "attempts")})
                for svc in ("cpu-worker", "api"):
                    for cid in self.c.containers(svc, running=False):
                        logs = subprocess.run(["docker", "logs", cid], capture_output=True,
                                              text=True, timeout=60)
                        got += [ln for ln in (logs.stdout + logs.stderr).splitlines()
                                if job in ln][:20]
        return [errs, got]

    def max_token_gap(self) -> float:
        """The longest wait between two tokens of one stream (a stall a client sees)."""
        gaps: list[float] = []
        for rd in self.readers:
            ts = [t for t, e in zip(rd.times, rd.seen, strict=True) if e.event == "token"]
            gaps += [b - a for a, b in itertools.pairwise(ts)]
        return round(max(gaps, default=0.0), 2)
