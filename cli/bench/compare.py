"""`tokenq bench compare`: tokenq and the servers a user would otherwise pick, in one run.

Same GGUF, same thread count, same slots, same prompts:
1. tokenq: the embedded stack (Redis + API + 1 CPU worker), native jobs API;
2. `python -m llama_cpp.server --interrupt_requests False` (llama-cpp-python's own
   OpenAI server, one request at a time);
3. llama.cpp's C++ `llama-server -np <slots> -cb` (the practical limit), built from the
   source vendored in the llama-cpp-python sdist by cli/build_llama_server.sh; skipped
   with a message when it cannot be built.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenq.cli.bench.inprocess import run_inprocess
from tokenq.cli.bench.load import Level, budget_lines, render, run_level
from tokenq.cli.bench.peers import llama_server_args, llama_server_binary, peer_process, threads_of
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path


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

    stack = Stack(settings, models=[model], quiet=True,
                  scratch_redis=True).start()
    try:
        stack.wait_ready()
        measure("tokenq", stack.url, "native")
    finally:
        stack.stop()

    def peer(name: str, args: list[str], port: int, ready_path: str, log_name: str) -> None:
        url = f"http://127.0.0.1:{port}"
        try:
            with peer_process(args, url + ready_path, logs / log_name):
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
