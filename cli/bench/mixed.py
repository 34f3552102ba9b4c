"""`tokenq bench mixed`: interactive requests beside a saturating low-priority batch.

Each server gets three phases with the same requests:
1. idle: the interactive requests alone (Poisson arrivals, `priority: high` on tokenq);
2. batch alone: N post-call-summary-like jobs submitted at once (`priority: low`);
3. mixed: the same batch, and once it holds every slot, the same interactive arrivals.
Reported: interactive TTFT p50/p95 idle vs under the batch (and the p95 ratio; issue
target <= 1.5x), batch output tok/s alone vs mixed (target >= 0.9x).

Servers: tokenq (its own embedded stack: Redis, API, one worker), tokenq with preemption
off (`TOKENQ_WORKER__PREEMPT_MAX=0`: priority lanes only), and C++ llama-server (FIFO:
no priorities) where `tokenq bench compare` has built it (never built here; the
peer is skipped, with a message, when it is absent). With `--vllm`: tokenq's vLLM worker
(both ways) and vLLM's own OpenAI server (FIFO) on the same converted model folder.
Arrivals stop once the batch has drained, so every measured interactive request met a
busy server; how many did is shown.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from tokenq.cli.bench.load import Sample, one_job, one_openai, pct, prompt_text, request_body
from tokenq.cli.bench.peers import llama_server_args, llama_server_path, peer_process
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path

Send = Callable[[dict[str, Any], str], Sample]  # (request body, priority) -> its sample


@dataclass(frozen=True)
class MixedConfig:
    batch: int = 48  # low-priority jobs, submitted at once (outlasting the arrivals)
    batch_tokens: int = 256
    batch_words: int = 120  # a post-call transcript's worth of prompt
    arrivals: int = 16  # interactive requests (Poisson)
    rate: float = 0.5  # interactive arrivals per second
    group: int = 1  # interactive requests arriving together
    every_s: float | None = None  # fixed seconds between arrivals (groups); None: Poisson
    interactive_tokens: int = 32
    interactive_words: int = 30
    settle_s: float = 3.0  # after the batch is submitted, before the first arrival
    window_s: float = 300.0  # arrivals stop after this (or once the batch drained)
    seed: int = 7
    peers: bool = True

    @classmethod
    def quick(cls) -> MixedConfig:
        return cls(batch=4, batch_tokens=64, batch_words=20, arrivals=2, rate=10.0,
                   interactive_tokens=4, interactive_words=10, settle_s=0.5, window_s=30,
                   peers=False)


@dataclass
class Phase:
    ttft_ms: list[float] = field(default_factory=list)  # interactive, successful
    errors: int = 0
    batch_tokens: int = 0
    batch_s: float = 0.0

    @property
    def batch_tok_s(self) -> float:
        return self.batch_tokens / self.batch_s if self.batch_s else 0.0


@dataclass
class Figures:
    server: str
    idle_ttft_p50_ms: float
    idle_ttft_p95_ms: float
    mixed_ttft_p50_ms: float
    mixed_ttft_p95_ms: float
    ttft_p95_ratio: float
    interactive_measured: int  # arrivals that met the batch running
    batch_alone_tok_s: float
    batch_mixed_tok_s: float
    batch_ratio: float
    errors: int


def long_text(tag: str, words: int) -> str:
    """A call transcript's worth of words, then an opening that invites a long text (a
    bare "Summary:" lets a small model stop at once, and the servers' runs would then
    differ in length, not in speed); unique per request, so no prompt cache serves it."""
    body = prompt_text(0, words).removesuffix("\nSummary:").split("] ", 1)[1]
    return f"[{tag}] {body}\n\nChapter 1. The night shift at the call center began when"


def arrival_times(cfg: MixedConfig) -> list[float]:
    """Seconds after the first arrival window opens: `group` requests at a time, the groups
    `every_s` apart or a Poisson process (the same each run)."""
    rng = random.Random(cfg.seed)
    t, out = 0.0, []
    for i in range(cfg.arrivals):
        if i and i % cfg.group == 0:
            t += cfg.every_s if cfg.every_s is not None else rng.expovariate(cfg.rate)
        out.append(t)
    return out


def run_phase(send: Send, model: str, cfg: MixedConfig, *, batch: bool,
              interactive: bool, tag: str, stop: list[str] | None = None) -> Phase:
    """One phase: the batch (all at once) and/or the interactive arrivals."""
    phase = Phase()
    drained = threading.Event()
    lock = threading.Lock()

    def batch_job(i: int) -> Sample:
        body = request_body(model, long_text(f"{tag}.{i}", cfg.batch_words),
                            cfg.batch_tokens, i, stop)
        return send(body, "low")

    def interactive_job(i: int) -> tuple[Sample, bool]:
        body = request_body(model, long_text(f"{tag}.q{i}", cfg.interactive_words),
                            cfg.interactive_tokens, 1000 + i, stop)
        busy = not drained.is_set()
        return send(body, "high"), busy

    with ThreadPoolExecutor(max_workers=cfg.batch + cfg.arrivals + 2) as pool:
        t0 = time.perf_counter()
        batch_futs: list[Future[Sample]] = []
        if batch:
            batch_futs = [pool.submit(batch_job, i) for i in range(cfg.batch)]

            def watch() -> None:
                for f in batch_futs:
                    s = f.result()
                    with lock:
                        phase.batch_tokens += s.tokens
                        phase.errors += not s.ok
                phase.batch_s = time.perf_counter() - t0
                drained.set()

            pool.submit(watch)
            time.sleep(cfg.settle_s)
        inter: list[Future[tuple[Sample, bool]]] = []
        if interactive:
            start = time.perf_counter()
            for i, at in enumerate(arrival_times(cfg)):
                wait = start + at - time.perf_counter()
                if (wait > 0 and drained.wait(wait)) or at > cfg.window_s:
                    break  # the batch drained (or the window closed): stop arriving
                inter.append(pool.submit(interactive_job, i))
        for fi in inter:
            s, busy = fi.result()
            with lock:
                phase.errors += not s.ok
            if s.ok and s.tokens and busy:
                phase.ttft_ms.append(1000 * s.ttft)
        if batch:
            drained.wait()
    return phase


def measure(server: str, send: Send, model: str, cfg: MixedConfig, console: Console,
            stop: list[str] | None = None) -> Figures:
    """The three phases on one server. `stop`: the model's tokenq stop strings, sent to
    every server (a peer that is not told stops later: different work)."""
    console.print(f"[bold]{server}[/]: idle, batch alone, mixed")
    # one request first, unmeasured: a fresh server's first one pays one-off costs
    send(request_body(model, long_text("warm-up", cfg.interactive_words), 4, 0, stop), "high")
    idle = run_phase(send, model, cfg, batch=False, interactive=True, tag="idle", stop=stop)
    alone = run_phase(send, model, cfg, batch=True, interactive=False, tag="alone", stop=stop)
    mixed = run_phase(send, model, cfg, batch=True, interactive=True, tag="mixed", stop=stop)
    idle_p95, mixed_p95 = pct(idle.ttft_ms, 0.95), pct(mixed.ttft_ms, 0.95)
    return Figures(
        server=server, idle_ttft_p50_ms=pct(idle.ttft_ms, 0.5), idle_ttft_p95_ms=idle_p95,
        mixed_ttft_p50_ms=pct(mixed.ttft_ms, 0.5), mixed_ttft_p95_ms=mixed_p95,
        ttft_p95_ratio=mixed_p95 / idle_p95 if idle_p95 else float("nan"),
        interactive_measured=len(mixed.ttft_ms), batch_alone_tok_s=alone.batch_tok_s,
        batch_mixed_tok_s=mixed.batch_tok_s,
        batch_ratio=(mixed.batch_tok_s / alone.batch_tok_s if alone.batch_tok_s
                     else float("nan")),
        errors=idle.errors + alone.errors + mixed.errors)


def tokenq_send(client: httpx.Client) -> Send:
    return lambda body, priority: one_job(client, {**body, "priority": priority})


def openai_send(client: httpx.Client) -> Send:
    return lambda body, _priority: one_openai(client, body)  # FIFO: no priorities


def client_for(url: str, cfg: MixedConfig) -> httpx.Client:
    limits = httpx.Limits(max_connections=2 * (cfg.batch + cfg.arrivals) + 8)
    return httpx.Client(base_url=url, timeout=600, limits=limits)


def on_tokenq(settings: Settings, model: str, cfg: MixedConfig, console: Console,
              server: str, env: dict[str, str]) -> Figures:
    stack = Stack(settings, models=[model], quiet=True, env=env,
                  scratch_redis=True).start()
    try:
        stack.wait_ready(models=[model])
        with client_for(stack.url, cfg) as client:
            return measure(server, tokenq_send(client), model, cfg, console,
                           settings.models()[model].stop)
    finally:
        stack.stop()


def on_llama_server(settings: Settings, model: str, cfg: MixedConfig,
                    console: Console) -> Figures | None:
    binary = llama_server_path(build=False)
    if binary is None:
        console.print("[yellow]skipping C++ llama-server: not built (`tokenq bench compare` "
                      "builds it once)[/]")
        return None
    mc = settings.models()[model]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    args = llama_server_args(binary, mc, str(gguf_path(mc, settings.state_dir)), port, model)
    try:
        with peer_process(args, url + "/health", logs / "llama_server_mixed.log"), \
                client_for(url, cfg) as client:
            return measure("llama-server (C++, FIFO)", openai_send(client), model, cfg,
                           console, mc.stop)
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[yellow]skipping C++ llama-server: {exc}[/]")
        return None


def on_vllm_server(settings: Settings, folder: Path, model: str, cfg: MixedConfig,
                   console: Console) -> Figures:
    """vLLM's own OpenAI server on the same folder and engine settings (FIFO)."""
    from tokenq.cli.bench.compare_vllm import vllm_server_args

    mc = settings.models()[model]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with peer_process(vllm_server_args(str(folder), model, mc, port), url + "/v1/models",
                  settings.state_dir / "logs" / "vllm_server_mixed.log", timeout=600), \
            client_for(url, cfg) as client:
        return measure("vllm serve (FIFO)", openai_send(client), model, cfg, console, mc.stop)


def run_mixed(settings: Settings, model: str, cfg: MixedConfig, console: Console,
              vllm: bool = False) -> dict[str, Any]:
    """tokenq and its peers; `vllm`: tokenq's vLLM worker and `vllm serve` instead of the
    llama.cpp worker and llama-server."""
    folder = None
    if vllm:
        from tokenq.cli.bench.compare_vllm import on_vllm

        settings, folder = on_vllm(settings, model, console)
    results = [on_tokenq(settings, model, cfg, console, "tokenq", {})]
    if cfg.peers:
        results.append(on_tokenq(settings, model, cfg, console, "tokenq, preemption off",
                                 {"TOKENQ_WORKER__PREEMPT_MAX": "0"}))
        peer = (on_vllm_server(settings, folder, model, cfg, console) if folder is not None
                else on_llama_server(settings, model, cfg, console))
        if peer is not None:
            results.append(peer)
    render(console, results, cfg)
    return {"model": model, "config": asdict(cfg), "results": [asdict(f) for f in results]}


def render(console: Console, results: list[Figures], cfg: MixedConfig) -> None:
    pace = (f"{cfg.group} every {cfg.every_s:g} s" if cfg.every_s is not None
            else f"{cfg.rate:g}/s" + (f", {cfg.group} at a time" if cfg.group > 1 else ""))
    table = Table(title=f"tokenq bench mixed: {cfg.arrivals} interactive arrivals "
                        f"({pace}, {cfg.interactive_tokens} tokens) beside "
                        f"{cfg.batch} low-priority jobs of {cfg.batch_tokens} tokens")
    for col in ("server", "TTFT p50 idle", "TTFT p95 idle", "TTFT p50 batch",
                "TTFT p95 batch", "p95 ratio", "measured", "batch tok/s alone",
                "batch tok/s mixed", "batch ratio", "errors"):
        table.add_column(col, justify="right")
    for f in results:
        table.add_row(f.server, f"{f.idle_ttft_p50_ms:.0f} ms", f"{f.idle_ttft_p95_ms:.0f} ms",
                      f"{f.mixed_ttft_p50_ms:.0f} ms", f"{f.mixed_ttft_p95_ms:.0f} ms",
                      f"{f.ttft_p95_ratio:.2f}x", str(f.interactive_measured),
                      f"{f.batch_alone_tok_s:.1f}", f"{f.batch_mixed_tok_s:.1f}",
                      f"{f.batch_ratio:.2f}x", str(f.errors))
    console.print(table)


def config_from(quick: bool, batch: int | None, arrivals: int | None, rate: float | None,
                batch_tokens: int | None, peers: bool) -> MixedConfig:
    cfg = MixedConfig.quick() if quick else MixedConfig()
    return replace(cfg, batch=cfg.batch if batch is None else batch,
                   arrivals=cfg.arrivals if arrivals is None else arrivals,
                   rate=cfg.rate if rate is None else rate,
                   batch_tokens=cfg.batch_tokens if batch_tokens is None else batch_tokens,
                   peers=cfg.peers and peers)
