"""`tokenq bench compare --rounds N`: tokenq against C++ llama-server, N rounds, medians.

This machine class moves ±10% between runs, so one run cannot tell a 5% difference. Both
servers stay up for the whole run (same GGUF, threads and slots as `tokenq bench compare`), and each
round measures every level on both, in alternating order (round 0 tokenq first, round 1
llama-server first, ...), so drift hits both alike. Prompts carry the round in their first
characters: no round finds an earlier round's prompts in either server's prompt cache
(llama-server keeps one in RAM besides its slots'). Printed: every measurement, then per
level the median tok/s ratio and TTFT p50 difference with their range.

`--inprocess` adds a third peer to every round: tokenq's own engine driven in this
process (cli/bench/inprocess.py: no Redis, API, HTTP or worker), taking its turn in the same
rotation. Then the engine's ratio to llama-server and tokenq's ratio to its engine (what
the queue path costs on this host) are printed beside the first table.
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.table import Table

from tokenq.cli.bench.load import Level, run_level
from tokenq.cli.bench.peers import llama_server_args, llama_server_binary, peer_process
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import free_port
from tokenq.shared.settings import Settings
from tokenq.shared.weights import gguf_path

TOKENQ, PEER, ENGINE = "tokenq", "llama-server (C++)", "engine in-process"


def compare_rounds(settings: Settings, model: str, levels: list[int], rounds: int,
                   requests: int | None, prompt_words: int, max_tokens: int,
                   console: Console, inprocess: bool = False) -> dict[str, Any]:
    cfg = settings.models()[model]
    binary = llama_server_binary(console)
    if binary is None:
        raise SystemExit("--rounds compares against C++ llama-server, which could not be built")
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    peer_url = f"http://127.0.0.1:{port}"
    runs: dict[str, dict[int, list[Level]]] = {TOKENQ: {}, PEER: {}}
    engine = None
    if inprocess:
        from tokenq.cli.bench.inprocess import InProcess

        engine = InProcess(settings, model)
        runs[ENGINE] = {}
    stack = Stack(settings, models=[model], quiet=True,
                  scratch_redis=True).start()
    try:
        stack.wait_ready()
        with peer_process(llama_server_args(binary, cfg, str(gguf_path(cfg, settings.state_dir)),
                                        port, model), peer_url + "/health",
                      logs / "llama_server.log"):
            for r in range(rounds):
                for c in levels:
                    order = [(TOKENQ, stack.url, "native"), (PEER, peer_url, "openai")]
                    order = order[::-1] if r % 2 else order
                    if engine is not None:  # each peer first in turn
                        order = [(ENGINE, "", ""), *order]
                        order = order[r % 3:] + order[:r % 3]
                    for name, url, api in order:
                        n = requests or 4 * c
                        lv = (engine.run_level(c, n, prompt_words, max_tokens, salt=f"r{r}.")
                              if name == ENGINE and engine is not None else
                              run_level(url, model, c, n, prompt_words, max_tokens, api=api,
                                        stop=cfg.stop, salt=f"r{r}."))
                        runs[name].setdefault(c, []).append(lv)
                        console.print(f"round {r + 1}/{rounds} c={c} {name}: "
                                      f"{lv.output_tok_s:.1f} tok/s, TTFT p50 "
                                      f"{lv.ttft_p50_ms:.0f} ms, ITL p50 {lv.itl_p50_ms:.1f} ms, "
                                      f"{lv.errors} errors")
    finally:
        stack.stop()
        if engine is not None:
            engine.close()
    return summarize(runs, levels, console)


def summarize(runs: dict[str, dict[int, list[Level]]], levels: list[int],
              console: Console) -> dict[str, Any]:
    table = Table(title="tokenq / C++ llama-server, medians over rounds [min-max]")
    for col in ("c", "tokenq tok/s", "llama-server tok/s", "ratio", "TTFT p50 diff"):
        table.add_column(col, justify="right")
    out: dict[str, Any] = {"rounds": {n: {c: [lv.__dict__ for lv in lvs]
                                          for c, lvs in by_c.items()}
                                      for n, by_c in runs.items()}, "levels": []}
    for c in levels:
        ours, theirs = runs[TOKENQ][c], runs[PEER][c]
        ratios = [a.output_tok_s / b.output_tok_s for a, b in zip(ours, theirs, strict=True)]
        diffs = [a.ttft_p50_ms - b.ttft_p50_ms for a, b in zip(ours, theirs, strict=True)]
        row = {"concurrency": c,
               "tokenq_tok_s": statistics.median(a.output_tok_s for a in ours),
               "peer_tok_s": statistics.median(b.output_tok_s for b in theirs),
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
               "ratio_max": max(ratios), "ttft_p50_diff_median_ms": statistics.median(diffs),
               "ttft_p50_diff_min_ms": min(diffs), "ttft_p50_diff_max_ms": max(diffs)}
        out["levels"].append(row)
        table.add_row(str(c), f"{row['tokenq_tok_s']:.1f}", f"{row['peer_tok_s']:.1f}",
                      f"{row['ratio_median']:.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]",
                      f"{row['ttft_p50_diff_median_ms']:+.0f} ms "
                      f"[{min(diffs):+.0f}, {max(diffs):+.0f}]")
    console.print(table)
    if ENGINE in runs:
        engine_rows(runs, out, console)
    return out


def _ratios(ours: list[Level], theirs: list[Level]) -> tuple[float, float, float]:
    got = [a.output_tok_s / b.output_tok_s for a, b in zip(ours, theirs, strict=True)]
    return statistics.median(got), min(got), max(got)


def engine_rows(runs: dict[str, dict[int, list[Level]]], out: dict[str, Any],
                console: Console) -> None:
    """The engine in-process against llama-server, and tokenq against its own engine (the
    queue path's cost), round by round: medians [min-max]."""
    table = Table(title="engine in-process / llama-server, and tokenq / engine in-process")
    for col in ("c", "engine tok/s", "engine / llama-server", "tokenq / engine",
                "TTFT p50, tokenq - engine"):
        table.add_column(col, justify="right")
    for row in out["levels"]:
        c = row["concurrency"]
        engine = runs[ENGINE][c]
        vs_peer, vs_engine = _ratios(engine, runs[PEER][c]), _ratios(runs[TOKENQ][c], engine)
        added = statistics.median(a.ttft_p50_ms - b.ttft_p50_ms
                                  for a, b in zip(runs[TOKENQ][c], engine, strict=True))
        row.update(engine_tok_s=statistics.median(a.output_tok_s for a in engine),
                   engine_ratio_median=vs_peer[0], engine_ratio_min=vs_peer[1],
                   engine_ratio_max=vs_peer[2], queue_path_ratio_median=vs_engine[0],
                   queue_path_ratio_min=vs_engine[1], queue_path_ratio_max=vs_engine[2],
                   queue_path_ttft_p50_added_ms=added)
        table.add_row(str(c), f"{row['engine_tok_s']:.1f}",
                      f"{vs_peer[0]:.3f}x [{vs_peer[1]:.3f}-{vs_peer[2]:.3f}]",
                      f"{vs_engine[0]:.3f}x [{vs_engine[1]:.3f}-{vs_engine[2]:.3f}]",
                      f"{added:+.0f} ms")
    console.print(table)
