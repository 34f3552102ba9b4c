"""`tokenq bench`: a streaming load generator for a tokenq endpoint.

For each concurrency level it sends a fixed number of streamed jobs and reports
output tok/s, TTFT, inter-token latency and end-to-end latency (p50/p95), then
the latency-budget arithmetic users plan with: measured prefill and decode
rates -> predicted latency for an input/output length, and whether a p95
budget holds at each level.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cli.sse import stream_events

FILLER = ("The customer called about a duplicate charge on the October invoice and asked "
          "for a refund to the original card. ")


@dataclass
class Sample:
    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0
    gaps: list[float] = field(default_factory=list)


@dataclass
class Level:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tok_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    e2e_p50_ms: float
    e2e_p95_ms: float
    prompt_tokens: float


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def one_job(client: httpx.Client, body: dict[str, Any]) -> Sample:
    t0 = time.perf_counter()
    try:
        resp = client.post("/v1/jobs", json=body)
        resp.raise_for_status()
        sample = Sample(ok=False)
        last = None
        for ev in stream_events(client, resp.json()["id"], timeout=600):
            now = time.perf_counter()
            if ev.event == "token":
                if last is None:
                    sample.ttft = now - t0
                else:
                    sample.gaps.append(now - last)
                last = now
                sample.tokens += 1
            elif ev.event == "done":
                sample.ok = True
                sample.prompt_tokens = ev.data["usage"]["prompt_tokens"]
            elif ev.event in ("error", "cancelled"):
                break
        sample.e2e = time.perf_counter() - t0
        return sample
    except httpx.HTTPError:
        return Sample(ok=False, e2e=time.perf_counter() - t0)


def run_level(url: str, model: str, concurrency: int, requests: int, prompt_words: int,
              max_tokens: int, progress: Progress | None = None) -> Level:
    prompt = " ".join((FILLER * (prompt_words // 20 + 1)).split()[:prompt_words])
    lock = threading.Lock()
    task = progress.add_task(f"c={concurrency}", total=requests) if progress else None

    def go(i: int) -> Sample:
        body = {"model": model, "prompt": f"[{i}] {prompt}\nSummary:", "max_tokens": max_tokens,
                "temperature": 0.7, "seed": i}
        s = one_job(client, body)
        if progress is not None and task is not None:
            with lock:
                progress.advance(task)
        return s

    limits = httpx.Limits(max_connections=concurrency * 2 + 4)
    with httpx.Client(base_url=url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            samples = list(pool.map(go, range(requests)))
        wall = time.perf_counter() - t0
    good = [s for s in samples if s.ok]
    gaps = [g for s in good for g in s.gaps]
    return Level(
        concurrency=concurrency, requests=requests, errors=requests - len(good), wall_s=wall,
        output_tok_s=sum(s.tokens for s in good) / wall,
        ttft_p50_ms=1000 * pct([s.ttft for s in good], 0.5),
        ttft_p95_ms=1000 * pct([s.ttft for s in good], 0.95),
        itl_p50_ms=1000 * pct(gaps, 0.5), itl_p95_ms=1000 * pct(gaps, 0.95),
        e2e_p50_ms=1000 * pct([s.e2e for s in good], 0.5),
        e2e_p95_ms=1000 * pct([s.e2e for s in good], 0.95),
        prompt_tokens=statistics.mean(s.prompt_tokens for s in good) if good else 0.0,
    )


def budget_lines(levels: list[Level], max_tokens: int, budget_s: float) -> list[str]:
    """Prefill/decode rates from c=1, the latency they predict, and the p95 check per level."""
    base = levels[0]
    lines = []
    if base.ttft_p50_ms > 0 and base.itl_p50_ms > 0:
        prefill = base.prompt_tokens / (base.ttft_p50_ms / 1000)
        decode = 1000 / base.itl_p50_ms
        predicted = base.prompt_tokens / prefill + (max_tokens - 1) / decode
        lines.append(f"single stream: prefill ~{prefill:.0f} tok/s, decode ~{decode:.1f} tok/s "
                      f"-> predicted {base.prompt_tokens:.0f} in + {max_tokens} out = "
                      f"{predicted:.2f} s")
    for lv in levels:
        verdict = "holds" if lv.e2e_p95_ms / 1000 <= budget_s else "misses"
        lines.append(f"c={lv.concurrency}: e2e p95 {lv.e2e_p95_ms / 1000:.2f} s {verdict} "
                     f"a {budget_s:.2f} s budget")
    return lines


def render(console: Console, levels: list[Level], lines: list[str]) -> None:
    table = Table(title="tokenq bench")
    for col in ("c", "reqs", "err", "out tok/s", "TTFT p50", "TTFT p95", "ITL p50", "ITL p95",
                "e2e p50", "e2e p95"):
        table.add_column(col, justify="right")
    for lv in levels:
        table.add_row(str(lv.concurrency), str(lv.requests), str(lv.errors),
                      f"{lv.output_tok_s:.1f}", f"{lv.ttft_p50_ms:.0f} ms",
                      f"{lv.ttft_p95_ms:.0f} ms", f"{lv.itl_p50_ms:.0f} ms",
                      f"{lv.itl_p95_ms:.0f} ms", f"{lv.e2e_p50_ms:.0f} ms",
                      f"{lv.e2e_p95_ms:.0f} ms")
    console.print(table)
    for line in lines:
        console.print(line)


def bench(url: str, model: str, levels: list[int], requests: int | None, prompt_words: int,
          max_tokens: int, budget_s: float, quiet: bool = False) -> dict[str, Any]:
    console = Console(stderr=True, quiet=quiet)
    results = []
    with Progress(console=console, transient=True, disable=quiet) as progress:
        for c in levels:
            results.append(run_level(url, model, c, requests or max(4, 2 * c), prompt_words,
                                     max_tokens, progress))
    lines = budget_lines(results, max_tokens, budget_s)
    render(console, results, lines)
    return {"model": model, "max_tokens": max_tokens, "prompt_words": prompt_words,
            "levels": [asdict(lv) for lv in results], "budget": lines}
