"""The embedded stack: Redis (unless TOKENQ_REDIS_URL is set), the API, N CPU workers.

Each part is a child process in its own session, so a terminal's Ctrl-C
reaches only this supervisor, which then stops them in order: API first (no
new jobs), then workers (SIGTERM = Celery warm shutdown: finish what is
running), then Redis (SIGTERM: AOF flushed). Nothing is left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx

import tokenq
from tokenq.shared.redis_server import EmbeddedRedis, die_with_parent, free_port, port_taken
from tokenq.shared.settings import Settings
from tokenq.shared.weights import missing_weights

if TYPE_CHECKING:
    from tokenq.cli.autoscale import Autoscaler

log = logging.getLogger("tokenq.stack")

# The tree this code runs from. Children import from it first, whatever their working
# directory: `python -m` would otherwise put the working directory ahead of PYTHONPATH,
# and a stack started from one checkout with PYTHONPATH=<another> would run the other's
# client against this one's API and workers (an A/B of two trees that compares nothing).
# The folder holding the `tokenq` package: a checkout's root (where tokenq/api, ... link
# to its top-level folders), or site-packages.
ROOT = Path(tokenq.__file__).resolve().parents[1]
# Installed (not a checkout): the children find it where the parent did; PYTHONPATH would
# put all of site-packages ahead of the standard library.
INSTALLED = str(ROOT) in {*site.getsitepackages(), site.getusersitepackages()}


def python_module(module: str, *args: str) -> list[str]:
    """argv for `python -m module args` that imports this tree's code (`-P`: no working
    directory on sys.path; _env puts a checkout's ROOT first on PYTHONPATH)."""
    return [sys.executable, "-P", "-m", module, *args]


def default_models(settings: Settings) -> list[str]:
    """What `tokenq up` serves when no --model is named: TOKENQ_SERVED_MODELS when set, else
    the chat default and the embedding default (the latter only where its weights are
    installed: its package is installed by hand, see missing_weights)."""
    if settings.served_models:
        return list(settings.served_models)
    names: list[str] = []
    registry = settings.models()
    for name in settings.default_served():
        cfg = registry.get(name)
        hint = missing_weights(cfg, settings.state_dir) if cfg else None
        if hint and name == settings.default_embedding_model and names:
            log.warning("not serving %s: its weights are not installed (%s)", name, hint)
            continue
        names.append(name)
    return names


@dataclass
class Stack:
    settings: Settings
    host: str = "127.0.0.1"
    # 0: a free loopback port, picked at start; picked again if the API finds it taken (a
    # picked port can be bound by another process between the pick and the API's bind).
    port: int = 0
    workers: int = 1
    models: list[str] = field(default_factory=list)
    quiet: bool = False  # send children's logs to files under state_dir/logs
    drain_timeout_s: float = 60.0
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every child
    # A benchmark's queue: an embedded Redis on a fresh folder, removed at stop(), so that
    # jobs left in the state dir's Redis (a killed run, the user's own) never run in it.
    scratch_redis: bool = False
    redis: EmbeddedRedis | None = None
    api: subprocess.Popen[bytes] | None = None
    worker_procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    # With an autoscaler, it owns the workers: starts, drains, and replaces them.
    autoscaler: Autoscaler | None = None
    redis_url: str = ""
    _logs: list[IO[bytes]] = field(default_factory=list)
    _spawned: dict[str, int] = field(default_factory=dict)
    _picked: bool = False  # the API's port was picked here (port 0)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["TOKENQ_REDIS_URL"] = self.redis_url
        env["TOKENQ_STATE_DIR"] = str(self.settings.state_dir)
        env["TOKENQ_SERVED_MODELS"] = json.dumps(self.models)
        if self.settings.models_file:
            env["TOKENQ_MODELS_FILE"] = str(self.settings.models_file)
        if self.settings.redis_sentinels:  # the children follow the same failovers
            env["TOKENQ_REDIS_SENTINELS"] = ",".join(self.settings.redis_sentinels)
            env["TOKENQ_REDIS_MASTER_NAME"] = self.settings.redis_master_name
            if self.settings.redis_sentinel_password:
                env["TOKENQ_REDIS_SENTINEL_PASSWORD"] = self.settings.redis_sentinel_password
        env.update(self.env)
        if not INSTALLED:
            root, path = str(ROOT), env.get("PYTHONPATH", "").split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join([root, *(p for p in path if p and p != root)])
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        out: IO[bytes] | None = None
        if self.quiet:
            logs = self.settings.state_dir / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            out = open(logs / f"{name}.log", "ab")
            self._logs.append(out)
        return subprocess.Popen(args, env=self._env(), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT if out else None,
                                start_new_session=True, preexec_fn=die_with_parent)

    def start(self) -> Stack:
        return self.start_parts()

    def start_parts(self, worker_models: list[str] | None = None) -> Stack:
        """Start Redis (if embedded), the API, and workers for `worker_models` (all served)."""
        self.models = self.models or default_models(self.settings)
        known = self.settings.models()
        for m in self.models:
            if m not in known:
                raise SystemExit(f"unknown model {m!r}; known: {', '.join(known)}")
        self.start_redis()
        if self.port == 0:
            self.port, self._picked = free_port(), True
        self._spawn_api()
        for model in self.models if worker_models is None else worker_models:
            # a model served by several pools (placement): workers for each
            pools = known[model].pools if model in known else {}
            for name in [f"{model}@{p}" for p in pools] or [model]:
                for _ in range(self.workers):
                    self.add_worker(name)
        return self

    def _spawn_api(self) -> None:
        self.api = self._spawn("api", python_module("tokenq.api.server", "--host", self.host,
                                                    "--port", str(self.port)))

    def _api_moved(self) -> bool:
        """The API exited: if on a picked port that another process holds now, start it on
        another one (True)."""
        if not self._picked or not port_taken(self.host, self.port):
            return False
        log.warning("port %d was taken before the API bound it; picking another", self.port)
        self.port = free_port()
        self._spawn_api()
        return True

    def attach(self) -> Stack:
        """Use the external Redis of TOKENQ_REDIS_URL and start nothing (for the autoscaler)."""
        self.redis_url = self.settings.require_redis_url()
        self.models = self.models or default_models(self.settings)
        return self

    def spawn_worker(self, model: str) -> subprocess.Popen[bytes]:
        """Start one worker process for `model` (not supervised: see add_worker)."""
        n = self._spawned[model] = self._spawned.get(model, -1) + 1
        return self._spawn(f"worker-{model}-{n}",
                           python_module("tokenq.cli.main", "worker", "--model", model))

    def add_worker(self, model: str) -> subprocess.Popen[bytes]:
        proc = self.spawn_worker(model)
        self.worker_procs.append((model, proc))
        return proc

    def restart_dead_workers(self) -> int:
        """Replace every worker that exited (what `tokenq up` does once a second)."""
        restarted = 0
        for model, proc in list(self.worker_procs):
            if proc.poll() is not None:
                log.warning("worker for %s exited (%s); restarting", model, proc.returncode)
                self.worker_procs.remove((model, proc))
                self.add_worker(model)
                restarted += 1
        return restarted

    def wait_ready(self, timeout: float = 180.0, models: list[str] | None = None) -> None:
        """Until /ready is 200 (or, with `models`, until those models have a live worker;
        `models=[]`: until the API and Redis answer).
        With an autoscaler, workers come with jobs: until the API answers /health."""
        deadline = time.monotonic() + timeout
        path = "/health" if self.autoscaler is not None and self.autoscaler.models else "/ready"
        last, moves = "", 0
        while time.monotonic() < deadline:
            if self.api is not None and self.api.poll() is not None:
                if moves < 3 and self._api_moved():
                    moves += 1
                    continue
                raise RuntimeError(f"the API exited with code {self.api.returncode}")
            for model, proc in self.worker_procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a worker for {model} exited with code {proc.returncode}")
            try:
                r = httpx.get(f"{self.url}{path}", timeout=2)
                if r.status_code == 200:
                    return
                if models is not None and r.status_code == 503 and "workers" in r.json():
                    if all(r.json()["workers"].get(m) for m in models):
                        return
                last = r.text
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.25)
        raise TimeoutError(f"stack not ready after {timeout:.0f}s: {last}")

    def start_redis(self) -> None:
        """The settings' Redis, or an embedded one (on the state dir's folder, or a scratch
        folder)."""
        if self.settings.redis_url and not self.scratch_redis:
            self.redis_url = self.settings.redis_url
            return
        state = Path(self.settings.state_dir)
        if self.scratch_redis:
            state.mkdir(parents=True, exist_ok=True)
            folder = Path(tempfile.mkdtemp(prefix="bench-redis-", dir=state))
        else:
            folder = state / "redis"
        self.redis = EmbeddedRedis(folder).start()
        self.redis_url = self.redis.url
        log.info("embedded redis-server on %s", self.redis_url)

    def stop(self) -> None:
        if self.api is not None:  # drains: open streams get api_drain_s to finish
            _terminate([self.api], self.settings.api.drain_s + 10)
        if self.autoscaler is not None:
            self.autoscaler.close(self.drain_timeout_s)
        _terminate([p for _, p in self.worker_procs], self.drain_timeout_s)
        if self.redis is not None:
            self.redis.stop()
            if self.scratch_redis:
                shutil.rmtree(self.redis.data_dir, ignore_errors=True)
        for f in self._logs:
            f.close()

    def run_foreground(self) -> int:
        """Run until SIGTERM/SIGINT, then stop everything; restart workers that die."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        code = 0
        tick_s = self.settings.autoscale.interval_s if self.autoscaler else 1.0
        try:
            self.wait_ready()
            log.info("tokenq is up: %s (models: %s)", self.url, ", ".join(self.models))
            while not stop.wait(tick_s):
                if self.api is not None and self.api.poll() is not None:
                    log.error("the API exited (%s); stopping", self.api.returncode)
                    code = 1
                    break
                if self.autoscaler is not None:
                    self.autoscaler.step()
                self.restart_dead_workers()
        except (TimeoutError, RuntimeError) as exc:
            log.error("%s", exc)
            code = 1
        finally:
            log.info("stopping: api, workers (drain), redis")
            self.stop()
        return code


def _terminate(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
