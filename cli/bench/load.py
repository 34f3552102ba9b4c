"""`tokenq bench run`: a streaming load generator for a tokenq endpoint.

For each concurrency level it sends a fixed number of streamed jobs and reports
output tok/s, TTFT, inter-token latency and end-to-end latency (p50/p95), then
the latency-budget arithmetic users plan with: measured prefill and decode
rates -> predicted latency for an input/output length, and whether a p95
budget holds at each level.
"""

from __future__ import annotations

import itertools
import json
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

from tokenq.client.sse import stream_events

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
    started: float = field(default_factory=time.perf_counter)
    _last: float | None = None

    def tick(self) -> None:
        """One token arrived now: the first sets TTFT, the rest add inter-token gaps."""
        now = time.perf_counter()
        if self._last is None:
            self.ttft = now - self.started
        else:
            self.gaps.append(now - self._last)
        self._last = now
        self.tokens += 1


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

    @classmethod
    def from_samples(cls, concurrency: int, samples: list[Sample], wall: float) -> Level:
        good = [s for s in samples if s.ok]
        gaps = [g for s in good for g in s.gaps]
        return cls(
            concurrency=concurrency, requests=len(samples), errors=len(samples) - len(good),
            wall_s=wall, output_tok_s=sum(s.tokens for s in good) / wall,
            ttft_p50_ms=1000 * pct([s.ttft for s in good], 0.5),
            ttft_p95_ms=1000 * pct([s.ttft for s in good], 0.95),
            itl_p50_ms=1000 * pct(gaps, 0.5), itl_p95_ms=1000 * pct(gaps, 0.95),
            e2e_p50_ms=1000 * pct([s.e2e for s in good], 0.5),
            e2e_p95_ms=1000 * pct([s.e2e for s in good], 0.95),
            prompt_tokens=statistics.mean(s.prompt_tokens for s in good) if good else 0.0,
        )


def prompt_text(i: int, words: int, concurrency: int = 0, salt: str = "") -> str:
    """The i-th benchmark prompt of a level: ~`words` words of call-center text, unique per
    request and per level (a level must not find the previous level's prompts in a
    server's prompt cache: llama-server and tokenq both keep one per slot, and
    llama-server another in RAM); `salt` tells repeated rounds apart."""
    body = " ".join((FILLER * (words // 20 + 1)).split()[:words])
    return f"[{salt}{concurrency}.{i}] {body}\nSummary:"


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
        sample = Sample(ok=False, started=t0)
        for ev in stream_events(client, resp.json()["id"], timeout=600):
            if ev.event == "token":
                sample.tick()
            elif ev.event == "done":
                sample.ok = True
                sample.prompt_tokens = ev.data["usage"]["prompt_tokens"]
            elif ev.event in ("error", "cancelled"):
                break
        sample.e2e = time.perf_counter() - t0
        return sample
    except httpx.HTTPError:
        return Sample(ok=False, e2e=time.perf_counter() - t0)


def one_openai(client: httpx.Client, body: dict[str, Any]) -> Sample:
    """A streamed /v1/completions request (OpenAI chunk format; one chunk per token)."""
    t0 = time.perf_counter()
    sample = Sample(ok=False, started=t0)
    try:
        req = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with client.stream("POST", "/v1/completions", json=req) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    sample.ok = True
                    break
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    sample.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    sample.tick()
    except httpx.HTTPError:
        pass
    sample.e2e = time.perf_counter() - t0
    return sample


# Sent explicitly to every peer: each server otherwise applies its own defaults (tokenq's
# model entry and llama.cpp's servers: top_k 40, top_p 0.95; vLLM's server: neither, a
# cheaper sampler), and the comparison would be of different work.
SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "top_k": 40}


def request_body(model: str, prompt: str, max_tokens: int, seed: int,
                 stop: list[str] | None = None) -> dict[str, Any]:
    """One benchmark request, the same for every peer. `stop`: the model's tokenq stop
    strings (tokenq would add them on its own; a peer that is not told stops later and never
    holds back a token that might begin one, which is less work than tokenq's)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                            "seed": seed, **SAMPLING}
    if stop:
        body["stop"] = stop
    return body


def run_level(url: str, model: str, concurrency: int, requests: int, prompt_words: int,
              max_tokens: int, progress: Progress | None = None, api: str = "native",
              stop: list[str] | None = None, api_key: str | None = None,
              salt: str = "") -> Level:
    lock = threading.Lock()
    task = progress.add_task(f"c={concurrency}", total=requests) if progress else None

    def go(i: int) -> Sample:
        body = request_body(model, prompt_text(i, prompt_words, concurrency, salt), max_tokens,
                            i, stop)
        s = one_job(client, body) if api == "native" else one_openai(client, body)
        if progress is not None and task is not None:
            with lock:
                progress.advance(task)
        return s

    limits = httpx.Limits(max_connections=concurrency * 2 + 4)
    with httpx.Client(base_url=url, timeout=600, limits=limits,
                      headers=auth_headers(api_key)) as client:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            samples = list(pool.map(go, range(requests)))
        wall = time.perf_counter() - t0
    return Level.from_samples(concurrency, samples, wall)


def budget_lines(levels: list[Level], max_tokens: int, budget_s: float) -> list[str]:
    """Prefill/decode rates from c=1, the latency they predict, and the p95 check per level."""
    base = levels[0]
    lines = []
    if base.prompt_tokens > 0 and base.ttft_p50_ms > 0 and base.itl_p50_ms > 0:
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


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def bench(url: str, model: str, levels: list[int], requests: int | None, prompt_words: int,
          max_tokens: int, budget_s: float, quiet: bool = False,
          api_key: str | None = None) -> dict[str, Any]:
    console = Console(stderr=True, quiet=quiet)
    results = []
    with Progress(console=console, transient=True, disable=quiet) as progress:
        for c in levels:
            results.append(run_level(url, model, c, requests or max(4, 2 * c), prompt_words,
                                     max_tokens, progress, api_key=api_key))
    lines = budget_lines(results, max_tokens, budget_s)
    render(console, results, lines)
    return {"model": model, "max_tokens": max_tokens, "prompt_words": prompt_words,
            "levels": [asdict(lv) for lv in results], "budget": lines}


def long_prompt_impact(url: str, model: str, streams: int = 7, long_words: int = 1850,
                       max_tokens: int = 400, settle_s: float = 8.0,
                       api_key: str | None = None) -> dict[str, float]:
    """p95 inter-token latency of `streams` decoding jobs before vs while one long prompt
    is prefilled next to them (from its submission to its first token)."""
    stamps: list[list[float]] = [[] for _ in range(streams)]
    ended = [False] * streams
    window: dict[str, float] = {}

    def background(i: int) -> None:
        # Streams must still be decoding when the long prompt lands: invite a long text
        # (a "Summary:" prompt can end at once on a small model).
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0.7, "seed": i,
                "prompt": f"Chapter {i + 1}. The night shift at the call center began when"}
        resp = client.post("/v1/jobs", json=body)
        for ev in stream_events(client, resp.json()["id"], timeout=600):
            if ev.event == "token":
                stamps[i].append(time.perf_counter())
        ended[i] = True

    def long_job() -> None:
        # The window "before" needs every stream decoding: on a loaded machine the first
        # tokens can take longer than settle_s, so wait for them first (bounded).
        deadline = time.monotonic() + 300
        while (any(len(s) < 2 and not e for s, e in zip(stamps, ended, strict=True))
               and time.monotonic() < deadline):
            time.sleep(0.05)
        time.sleep(settle_s)
        body = {"model": model, "prompt": prompt_text(9999, long_words), "max_tokens": 8,
                "temperature": 0.7}
        window["start"] = time.perf_counter()
        resp = client.post("/v1/jobs", json=body)
        resp.raise_for_status()
        for ev in stream_events(client, resp.json()["id"], timeout=600):
            if ev.event == "token" and "end" not in window:
                window["end"] = time.perf_counter()
            if ev.event == "done":
                window["prompt_tokens"] = ev.data["usage"]["prompt_tokens"]

    limits = httpx.Limits(max_connections=2 * streams + 8)
    with httpx.Client(base_url=url, timeout=600, limits=limits,
                      headers=auth_headers(api_key)) as client, \
            ThreadPoolExecutor(max_workers=streams + 1) as pool:
        futures = [pool.submit(background, i) for i in range(streams)]
        futures.append(pool.submit(long_job))
        for f in futures:
            f.result()
    start, end = window["start"], window["end"]
    # A gap counts where it ends: a client feels a gap that ends during the prefill.
    before = [b - a for s in stamps for a, b in itertools.pairwise(s)
              if start - settle_s / 2 < b <= start]
    during = [b - a for s in stamps for a, b in itertools.pairwise(s) if start < b <= end]
    out = {"prompt_tokens": window.get("prompt_tokens", 0.0),
           "prefill_s": end - start, "itl_p95_before_ms": 1000 * pct(before, 0.95),
           "itl_p95_during_ms": 1000 * pct(during, 0.95)}
    out["ratio"] = out["itl_p95_during_ms"] / out["itl_p95_before_ms"]
    return out
