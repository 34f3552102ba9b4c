"""`tokenq bench --compare`: tokenq and the servers a user would otherwise pick, in one run.

Same GGUF, same thread count, same slots, same prompts:
1. tokenq: the embedded stack (Redis + API + 1 CPU worker), native jobs API;
2. `python -m llama_cpp.server --interrupt_requests False` (llama-cpp-python's own
   OpenAI server, one request at a time);
3. llama.cpp's C++ `llama-server -np <slots> -cb` (the practical limit), built from the
   source vendored in the llama-cpp-python sdist by cli/build_llama_server.sh; skipped
   with a message when it cannot be built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from tokenq.cli.bench import Level, budget_lines, render, run_level
from tokenq.cli.inprocess import run_inprocess
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import die_with_parent, free_port
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 180) -> None:
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
def _process(args: list[str], ready_url: str, log: Path,
             timeout: float = 180) -> Iterator[None]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        try:
            _wait_http(ready_url, proc, timeout)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


# The recipe ships in the wheel (package data): a checkout and an install build alike.
BUILD_LLAMA_SERVER = Path(__file__).resolve().parent / "build_llama_server.sh"


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


def compare(settings: Settings, model: str, levels: list[int], requests: int | None,
            prompt_words: int, max_tokens: int, budget_s: float,
            console: Console) -> dict[str, Any]:
    cfg = settings.models()[model]
    path = str(gguf_path(cfg, settings.state_dir))
    threads = threads_of(cfg)
    slots = cfg.n_parallel
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[Level]] = {}

    def measure(name: str, url: str, api: str) -> None:
        console.print(f"[bold]{name}[/] at {url}")
        results[name] = [run_level(url, model, c, requests or max(4, 2 * c), prompt_words,
                                   max_tokens, api=api, stop=cfg.stop) for c in levels]
        render(console, results[name], budget_lines(results[name], max_tokens, budget_s))

    console.print("[bold]engine in-process[/] (no queue, no HTTP)")
    results["engine in-process"] = run_inprocess(settings, model, levels, requests,
                                                 prompt_words, max_tokens)
    render(console, results["engine in-process"], [])

    stack = Stack(settings, port=free_port(), models=[model], quiet=True).start()
    try:
        stack.wait_ready()
        measure("tokenq", stack.url, "native")
    finally:
        stack.stop()

    def peer(name: str, args: list[str], port: int, ready_path: str, log_name: str) -> None:
        url = f"http://127.0.0.1:{port}"
        try:
            with _process(args, url + ready_path, logs / log_name):
                measure(name, url, "openai")
        except (RuntimeError, TimeoutError) as exc:  # one peer failing spoils nothing else
            console.print(f"[yellow]skipping {name}: {exc} (see {logs / log_name})[/]")

    port = free_port()
    peer("llama_cpp.server", [
        sys.executable, "-m", "llama_cpp.server", "--model", path, "--port", str(port),
        "--n_threads", threads, "--n_threads_batch", threads, "--n_ctx", str(cfg.n_ctx // slots),
        "--interrupt_requests", "False", "--model_alias", model],
        port, "/v1/models", "llama_cpp_server.log")

    binary = llama_server_binary(console)
    if binary:
        port = free_port()
        peer("llama-server (C++)", llama_server_args(binary, cfg, path, port, model),
             port, "/health", "llama_server.log")

    ratio_table(console, results)
    return {name: [lv.__dict__ for lv in lvs] for name, lvs in results.items()}


def ratio_table(console: Console, results: dict[str, list[Level]]) -> None:
    base = results["tokenq"]
    table = Table(title="tokenq / peer (output tok/s; TTFT p50 difference)")
    table.add_column("peer")
    for lv in base:
        table.add_column(f"c={lv.concurrency}", justify="right")
    ratio: Callable[[Level, Level], str] = lambda a, b: (  # noqa: E731
        f"{a.output_tok_s / b.output_tok_s:.2f}x, {a.ttft_p50_ms - b.ttft_p50_ms:+.0f} ms"
        if b.output_tok_s else "n/a")
    for name, lvs in results.items():
        if name != "tokenq":
            table.add_row(name, *[ratio(a, b) for a, b in zip(base, lvs, strict=True)])
    console.print(table)
