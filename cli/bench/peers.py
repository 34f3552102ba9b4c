"""The peer servers the benchmarks measure tokenq against, and how they are started.

`peer_process` runs a server as a child process (it dies with this one), waits until its
ready URL answers 200 and stops it on the way out; `llama_server_args` is C++ llama-server
as every comparison runs it (tokenq's GGUF, threads, slots and n_ctx), built for this CPU
by cli/build_llama_server.sh (`llama_server_path`, `llama_server_binary`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rich.console import Console

from tokenq.shared.redis_server import die_with_parent
from tokenq.shared.settings import ModelConfig


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"peer exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready")


@contextmanager
def peer_process(args: list[str], ready_url: str, log: Path,
                 timeout: float = 180) -> Iterator[None]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        try:
            wait_http(ready_url, proc, timeout)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


# The recipe ships in the wheel (package data of tokenq.cli, beside llama_cmake_args.sh): a
# checkout and an install build alike.
BUILD_LLAMA_SERVER = Path(__file__).resolve().parent.parent / "build_llama_server.sh"


def llama_server_path(*, build: bool) -> str | None:
    """The C++ llama-server built for this CPU (built first when `build`), or None."""
    args = ["bash", str(BUILD_LLAMA_SERVER), *([] if build else ["--find"])]
    try:
        out = subprocess.run(args, check=True, capture_output=True, text=True,
                             timeout=1800 if build else 60,
                             env={**os.environ, "PYTHON": sys.executable})
        return out.stdout.strip().splitlines()[-1]
    except subprocess.CalledProcessError as exc:
        if build:
            tail = (exc.stderr or "").strip().splitlines()[-3:]
            raise RuntimeError("; ".join(tail) or str(exc)) from None
        return None
    except (subprocess.SubprocessError, OSError, IndexError) as exc:
        if build:
            raise RuntimeError(str(exc)) from None
        return None


def llama_server_binary(console: Console) -> str | None:
    try:
        return llama_server_path(build=True)
    except RuntimeError as exc:
        console.print("[bold yellow]C++ llama-server skipped: it could not be built (needs "
                      f"cmake and a C++ compiler: apt-get install cmake g++): {exc}[/]")
        return None


def llama_server_args(binary: str, cfg: ModelConfig, path: str, port: int,
                      model: str) -> list[str]:
    """C++ llama-server as every comparison runs it: tokenq's GGUF, threads, slots, n_ctx."""
    return [binary, "-m", path, "--port", str(port), "-np", str(cfg.n_parallel), "-cb",
            "-t", threads_of(cfg), "-c", str(cfg.n_ctx), "-a", model]


def threads_of(cfg: ModelConfig) -> str:
    return str(cfg.n_threads or os.cpu_count() or 1)
