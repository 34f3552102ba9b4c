"""A Redis Sentinel deployment on loopback for the failover tests: a primary, one replica
(or more) and three sentinels (quorum 2), each a child process on a free port, killed at the end.

Sentinel's timings are short (down after 1 s, failover timeout 3 s) so a failover takes
seconds; every wait here is bounded and fails with what it was waiting for.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import redis

from tokenq.shared.redis_server import EmbeddedRedis, die_with_parent, find_redis_server, free_port
from tokenq.shared.settings import Settings

MASTER = "tokenq-ha"  # not the default, so the setting is exercised
# A replica's first sync without a 5 s wait (diskless, no delay).
REPL_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> float:
    """Poll `check` until true; the seconds it took. AssertionError naming `what` after
    `timeout` (generous: a loaded 2-core machine)."""
    start = time.monotonic()
    while True:
        with suppress(redis.RedisError):
            if check():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


class SentinelDeployment:
    def __init__(self, root: Path, *, replicas: int = 1, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000):
        self.root = root
        self.replicas = replicas
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.nodes: list[EmbeddedRedis] = []
        self.sentinel_ports: list[int] = []
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def primary(self) -> EmbeddedRedis:
        return self.nodes[0]

    @property
    def replica(self) -> EmbeddedRedis:
        return self.nodes[1]

    def start(self) -> SentinelDeployment:
        self.nodes.append(EmbeddedRedis(self.root / "n0", extra_args=REPL_ARGS).start())
        for i in range(1, self.replicas + 1):
            self.nodes.append(EmbeddedRedis(
                self.root / f"n{i}", extra_args=(*REPL_ARGS, "--replicaof", "127.0.0.1",
                                                 str(self.primary.port))).start())
            self.wait_replica_synced(self.nodes[i])
        for i in range(3):
            self.sentinel_ports.append(self._start_sentinel(i))
        for port in self.sentinel_ports:
            wait_for(f"sentinel {port} to see the replicas and 2 other sentinels",
                     lambda port=port: self._sees_all(port))  # type: ignore[misc]
        return self

    def _sees_all(self, port: int) -> bool:
        s = redis.Redis(port=port, decode_responses=True, socket_timeout=5)
        try:
            got: dict[str, Any] = s.sentinel_master(MASTER)  # type: ignore[assignment]
        finally:
            s.close()
        return (int(got["num-slaves"]) == self.replicas
                and int(got["num-other-sentinels"]) == 2)

    def _start_sentinel(self, i: int) -> int:
        port = free_port()
        d = self.root / f"s{i}"
        d.mkdir(parents=True, exist_ok=True)
        conf = d / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {d}\n"
            f"logfile {d / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER} 1\n")
        proc = subprocess.Popen([find_redis_server(), str(conf), "--sentinel"],
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent)
        self.sentinels.append(proc)
        c = redis.Redis(port=port)
        try:
            wait_for(f"sentinel {i} to answer PING", lambda: bool(c.ping()), timeout=30)
        finally:
            c.close()
        return port

    @staticmethod
    def wait_replica_synced(node: EmbeddedRedis) -> None:
        c = redis.Redis(port=node.port, decode_responses=True)
        try:
            wait_for(f"replica {node.port} in sync", lambda: (
                c.info("replication").get("master_link_status") == "up"))
        finally:
            c.close()

    def settings(self, **kw: Any) -> Settings:
        """tokenq's settings for this deployment. The URL's host:port is the first primary's;
        with sentinels only its password and db count."""
        return Settings(redis_url=f"redis://127.0.0.1:{self.primary.port}/0",
                        redis_sentinels=[f"127.0.0.1:{p}" for p in self.sentinel_ports],
                        redis_master_name=MASTER, **kw)

    def master_port(self) -> int:
        """The master's port as the sentinels' majority sees it."""
        ports = []
        for p in self.sentinel_ports:
            with suppress(redis.RedisError):
                s = redis.Redis(port=p, decode_responses=True, socket_timeout=2)
                try:
                    got: tuple[str, int] | None = s.sentinel_get_master_addr_by_name(
                        MASTER)  # type: ignore[assignment]
                finally:
                    s.close()
                if got:
                    ports.append(int(got[1]))
        return max(set(ports), key=ports.count) if ports else 0

    def client_of(self, node: EmbeddedRedis) -> redis.Redis:
        return redis.Redis(port=node.port, decode_responses=True, socket_timeout=5)

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for node in self.nodes:
            node.kill()


@contextmanager
def sentinel_deployment(root: Path, **kw: Any) -> Iterator[SentinelDeployment]:
    dep = SentinelDeployment(root, **kw)
    try:
        yield dep.start()
    finally:
        dep.stop()
