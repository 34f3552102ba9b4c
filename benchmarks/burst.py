"""Bursts of c requests on an idle server: every request of a burst posted at once, the next
burst once the last has ended. tokenq (one stack per variant: model-entry settings given
with --variant) and C++ llama-server on the same GGUF, in alternating order, in one run.
Prints each server's TTFT p50 and p95 per burst (median [min-max] over the bursts).
    .venv/bin/python benchmarks/burst.py [--model M] [--c 8] [--bursts 5] [--rounds 2]
        [--variant name:key=value,key=value ...]
A variant's keys are the model entry's (shared/settings.ModelConfig), e.g.
--variant flush0:first_token_flush_ms=0; without --variant: the entry as it is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenq.cli.bench.load import run_level
from tokenq.cli.bench.peers import llama_server_args, llama_server_path, peer_process
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, pairs = text.partition(":")
    changes = {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        changes[key] = json.loads(value)
    return name, changes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--c", type=int, default=8)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-words", type=int, default=80)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()
    base = Settings()
    mc = base.models()[args.model]
    variants = [parse_variant(v) for v in args.variant] or [("tokenq", {})]
    ttft: dict[str, list[tuple[float, float]]] = {}

    def bursts(name: str, url: str, api: str, salt: str) -> None:
        run_level(url, args.model, 1, 1, 20, 4, api=api, stop=mc.stop)  # warm
        for b in range(args.bursts):
            lv = run_level(url, args.model, args.c, args.c, args.prompt_words, args.max_tokens,
                           api=api, stop=mc.stop, salt=f"{salt}-{b}")
            ttft.setdefault(name, []).append((lv.ttft_p50_ms, lv.ttft_p95_ms))
            time.sleep(0.5)

    def on_tokenq(name: str, changes: dict[str, Any], salt: str) -> None:
        models = Path(tempfile.mkdtemp()) / "models.json"
        models.write_text(json.dumps({args.model: {**mc.model_dump(mode="json"), **changes}}))
        stack = Stack(Settings(models_file=models), models=[args.model],
                      quiet=True).start()
        try:
            stack.wait_ready(models=[args.model])
            bursts(name, stack.url, "native", salt)
        finally:
            stack.stop()

    def on_llama_server(salt: str) -> None:
        binary = llama_server_path(build=False)
        if binary is None:
            print("C++ llama-server not built (cli/build_llama_server.sh): skipped")
            return
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = llama_server_args(binary, mc, str(gguf_path(mc, base.state_dir)), port, args.model)
        log = base.state_dir / "logs" / "llama_server_burst.log"
        with peer_process(cmd, url + "/health", log):
            bursts("llama-server", url, "openai", salt)

    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for name, changes in order:
            on_tokenq(name, changes, f"r{r}-{name}")
        on_llama_server(f"r{r}-ls")
    n = args.bursts * args.rounds
    print(f"{args.model}, bursts of {args.c}, {args.prompt_words}-word prompts, "
          f"{args.max_tokens} tokens; TTFT per burst, median [min-max] of {n}:")
    for name, rows in ttft.items():
        p50 = [a for a, _ in rows]
        p95 = [b for _, b in rows]
        print(f"  {name:20s} p50 {statistics.median(p50):6.0f} ms [{min(p50):.0f}-{max(p50):.0f}]"
              f"   p95 {statistics.median(p95):6.0f} ms [{min(p95):.0f}-{max(p95):.0f}]")


if __name__ == "__main__":
    main()
