"""Options that several `tokenq bench` subcommands take: one definition, one help text.

A subcommand names its default where it declares the parameter (`model: Model = None`).
Every option has an environment twin, TOKENQ_BENCH_<SUBCOMMAND>_<OPTION> (typer's
auto_envvar_prefix: TOKENQ_BENCH_RUN_CONCURRENCY, TOKENQ_BENCH_MIXED_BATCH_JOBS); --api-key
reads TOKENQ_API_KEY.
"""

from __future__ import annotations

from typing import Annotated

import typer

Url = Annotated[str | None, typer.Option(help="endpoint; default: start the embedded stack")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="TOKENQ_API_KEY", help="API key for --url")]
Model = Annotated[str | None, typer.Option(help="a model in the registry (default: the "
                                                "default model)")]
Concurrency = Annotated[str, typer.Option(help="comma-separated levels")]
Requests = Annotated[int | None, typer.Option(help="requests per level (default 2 x c)")]
PromptWords = Annotated[int, typer.Option(help="words of each prompt")]
MaxTokens = Annotated[int, typer.Option(help="tokens each request generates at most")]
Budget = Annotated[float, typer.Option(help="p95 e2e budget in seconds")]
Json = Annotated[bool, typer.Option("--json", help="print results as JSON")]
Quick = Annotated[bool, typer.Option("--quick", help="small counts (a smoke run)")]
Vllm = Annotated[bool, typer.Option("--vllm", help="tokenq with one vLLM worker vs vLLM's "
                                                   "OpenAI server on the same converted model")]


def levels_of(concurrency: str) -> list[int]:
    """--concurrency "1,4,8" -> [1, 4, 8]."""
    try:
        levels = [int(c) for c in concurrency.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise typer.BadParameter(f"{concurrency!r}: comma-separated levels of 1 or more",
                                 param_hint="--concurrency")
    return levels
