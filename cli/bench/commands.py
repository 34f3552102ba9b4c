"""`tokenq bench <subcommand>`: one benchmark per subcommand, each with its own options.

A subcommand parses its options, imports its benchmark (tokenq.cli.bench.<module>) and
prints the result: a table and lines on the terminal, or with --json one JSON document on
stdout (progress and tables then go to stderr or nowhere). To add one, write the benchmark
in its own module here and a function below that takes the options (options.py has the
shared ones) and calls it; `@bench_app.command("<name>")` registers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tokenq.cli.bench.options import (
    ApiKey,
    Budget,
    Concurrency,
    Json,
    MaxTokens,
    Model,
    PromptWords,
    Quick,
    Requests,
    Url,
    Vllm,
    levels_of,
)
from tokenq.cli.settings_or_exit import settings_or_exit

if TYPE_CHECKING:
    from tokenq.shared.settings import Settings

bench_app = typer.Typer(
    no_args_is_help=True,
    help="Benchmarks: load on an endpoint (run, long-prompt), tokenq beside its peers "
    "(compare, paired), interactive beside a batch (mixed), the post-call batch beside "
    "llama-server (postcall), the queue itself (scale).")


def emit(result: Any, json_out: bool) -> None:
    """With --json, the result as one JSON document on stdout."""
    if json_out:
        typer.echo(json.dumps(result, indent=2))


@contextmanager
def endpoint(settings: Settings, url: str | None, model: str) -> Iterator[str]:
    """`url`, or an embedded stack serving `model` for as long as the block runs."""
    if url is not None:
        yield url
        return
    from tokenq.cli.stack import Stack

    stack = Stack(settings, models=[model], quiet=True,
                  scratch_redis=True).start()
    try:
        stack.wait_ready()
        yield stack.url
    finally:
        stack.stop()


@bench_app.command("run")
def run(url: Url = None, model: Model = None, concurrency: Concurrency = "1,4,8,16",
        requests: Requests = None, prompt_words: PromptWords = 80, max_tokens: MaxTokens = 64,
        budget: Budget = 1.5, json_out: Json = False, api_key: ApiKey = None) -> None:
    """Streaming load test: tok/s, TTFT, ITL and e2e latency per concurrency level.

    Against --url, or an embedded stack started for the run. Then the latency-budget
    arithmetic: prefill and decode rates at c=1, and whether the p95 budget holds."""
    from tokenq.cli.bench.load import bench

    settings = settings_or_exit()
    model = model or settings.default_model
    levels = levels_of(concurrency)
    with endpoint(settings, url, model) as where:
        result = bench(where, model, levels, requests, prompt_words, max_tokens, budget,
                       quiet=json_out, api_key=api_key)
    emit(result, json_out)


@bench_app.command("long-prompt")
def long_prompt(url: Url = None, model: Model = None, json_out: Json = False,
                api_key: ApiKey = None) -> None:
    """7 streams' inter-token latency p95 before vs during a ~2,000-token prefill."""
    from tokenq.cli.bench.load import long_prompt_impact

    settings = settings_or_exit()
    model = model or settings.default_model
    with endpoint(settings, url, model) as where:
        impact = long_prompt_impact(where, model, api_key=api_key)
    typer.echo(json.dumps(impact) if json_out else
               f"{impact['prompt_tokens']:.0f}-token prompt prefilled in "
               f"{impact['prefill_s']:.1f} s beside 7 streams: their ITL p95 "
               f"{impact['itl_p95_before_ms']:.0f} ms before, "
               f"{impact['itl_p95_during_ms']:.0f} ms during ({impact['ratio']:.2f}x)")


@bench_app.command("compare")
def compare(
    model: Model = None, concurrency: Concurrency = "1,4,8,16", requests: Annotated[
        int | None, typer.Option(help="requests per level (default 2 x c; 4 x c with "
                                      "--rounds)")] = None,
    prompt_words: PromptWords = 80, max_tokens: MaxTokens = 64, budget: Budget = 1.5,
    json_out: Json = False,
    rounds: Annotated[int, typer.Option(
        help="N rounds against C++ llama-server, both up, levels interleaved; medians and "
        "ranges")] = 1,
    inprocess: Annotated[bool, typer.Option(
        "--inprocess", help="with --rounds: tokenq's engine in-process (no queue) as a third "
        "peer in every round: the engine vs llama-server, tokenq vs its engine")] = False,
    vllm: Vllm = False,
) -> None:
    """tokenq beside llama_cpp.server, C++ llama-server and its engine in-process.

    Same model, threads, slots and prompts. --rounds N: against C++ llama-server only, both
    up, N rounds with the levels interleaved, medians and ranges. --vllm: tokenq with one
    vLLM worker against vLLM's OpenAI server."""
    from rich.console import Console

    if vllm and rounds > 1:
        raise typer.BadParameter("--rounds runs against C++ llama-server; not with --vllm",
                                 param_hint="--rounds")
    settings = settings_or_exit()
    model = model or settings.default_model
    levels = levels_of(concurrency)
    console = Console(stderr=json_out)  # with --json, stdout holds the JSON alone
    if rounds > 1:
        from tokenq.cli.bench.compare_rounds import compare_rounds

        out = compare_rounds(settings, model, levels, rounds, requests, prompt_words,
                             max_tokens, console, inprocess)
    elif vllm:
        from tokenq.cli.bench.compare_vllm import compare_vllm

        out = compare_vllm(settings, model, levels, requests, prompt_words, max_tokens, budget,
                           console)
    else:
        from tokenq.cli.bench.compare import compare as run_compare

        out = run_compare(settings, model, levels, requests, prompt_words, max_tokens, budget,
                          console)
    emit(out, json_out)


@bench_app.command("paired")
def paired(
    pairs: Annotated[int, typer.Option(help="pairs of jobs (one in-process, one through the "
                                            "stack), after one that warms both up")] = 30,
    model: Model = None, prompt_words: PromptWords = 80, json_out: Json = False,
) -> None:
    """The c=1 TTFT the queue path adds over tokenq's engine in-process.

    One job each way in turn, so that the machine's drift cancels out of each pair."""
    from tokenq.cli.bench.inprocess import paired_ttft

    settings = settings_or_exit()
    model = model or settings.default_model
    res = paired_ttft(settings, model, pairs, prompt_words)
    typer.echo(json.dumps(res) if json_out else
               f"{model}, {res['pairs']} pairs at c=1 ({res['skipped']} skipped: no first "
               f"token): TTFT p50 in-process "
               f"{res['inprocess_ttft_p50_ms']:.0f} ms, tokenq "
               f"{res['tokenq_ttft_p50_ms']:.0f} ms; added by the queue path: p50 "
               f"{res['added_p50_ms']:+.1f} ms, mean {res['added_mean_ms']:+.1f} ms")


@bench_app.command("mixed")
def mixed(
    model: Model = None, vllm: Vllm = False, quick: Quick = False,
    batch_jobs: Annotated[int | None, typer.Option(help="batch jobs (48)")] = None,
    batch_tokens: Annotated[int | None, typer.Option(
        help="max_tokens of a batch job (256)")] = None,
    arrivals: Annotated[int | None, typer.Option(help="interactive requests (16)")] = None,
    rate: Annotated[float | None, typer.Option(
        help="interactive arrivals per second, Poisson (0.5)")] = None,
    group: Annotated[int, typer.Option(help="interactive requests arriving together")] = 1,
    every: Annotated[float | None, typer.Option(
        help="seconds between arrivals (groups), fixed, instead of Poisson")] = None,
    peers: Annotated[bool, typer.Option(
        help="also run the peers: preemption off, C++ llama-server (or vLLM's server)")]
    = True,
    json_out: Json = False,
) -> None:
    """Interactive arrivals beside a saturating low-priority batch.

    Interactive (high priority) TTFT idle vs under the batch, batch tok/s alone vs mixed;
    peers: tokenq with preemption off, C++ llama-server (FIFO; or vLLM's server)."""
    from rich.console import Console

    from tokenq.cli.bench.mixed import config_from, run_mixed

    settings = settings_or_exit()
    out = run_mixed(settings, model or settings.default_model,
                    replace(config_from(quick, batch_jobs, arrivals, rate, batch_tokens,
                                        peers), group=max(1, group), every_s=every),
                    Console(stderr=json_out), vllm=vllm)
    emit(out, json_out)


@bench_app.command("scale")
def scale(
    quick: Quick = False,
    clients: Annotated[int | None, typer.Option(help="SSE streams (1000)")] = None,
    token_rate: Annotated[float | None, typer.Option(
        help="tok/s the synthetic source writes to the streams (2000)")] = None,
    posts: Annotated[int | None, typer.Option(help="POST /v1/jobs count (2000)")] = None,
    backlog: Annotated[int | None, typer.Option(help="backlog jobs (50000)")] = None,
    relay: Annotated[bool, typer.Option(
        help="also serve (a)'s traffic from a minimal relay, the API's bound")] = True,
    json_out: Json = False,
) -> None:
    """The queue itself, no model: SSE fan-out, POST /v1/jobs/s, memory, a backlog.

    On its own stack and the fake engine: SSE fan-out, POST /v1/jobs per second, Redis
    memory per job, a backlog drained with every job ending exactly once."""
    from tokenq.cli.bench.scale import ScaleConfig, run_scale

    cfg = replace(ScaleConfig.from_flags(quick, clients=clients, token_rate=token_rate,
                                         posts=posts, backlog=backlog), relay=relay)
    emit(run_scale(cfg, (lambda _: None) if json_out else typer.echo), json_out)


@bench_app.command("fair")
def fair(
    tenants: Annotated[int, typer.Option(help="tenants, one of them heavy")] = 10,
    heavy_factor: Annotated[float, typer.Option(help="the heavy tenant's demand, x a "
                                                     "light one's")] = 100.0,
    light_rate: Annotated[float, typer.Option(help="jobs/s per light tenant")] = 0.3,
    seconds: Annotated[float, typer.Option(help="seconds per arm (fair, FIFO, heavy "
                                                 "absent)")] = 60.0,
    window_s: Annotated[float, typer.Option(help="Jain's index window (s)")] = 30.0,
    workers: Annotated[int, typer.Option(help="worker processes")] = 2,
    apis: Annotated[int, typer.Option(help="API processes (one restarted midway)")] = 3,
    token_rate: Annotated[float, typer.Option(
        help="the fake engine's tokens/s per job (its step: 1/this)")] = 64.0,
    max_tokens: Annotated[int, typer.Option(help="tokens per job")] = 32,
    seed: Annotated[int, typer.Option(help="the arrivals' seed (0: those of earlier runs)")] = 0,
    seeds: Annotated[str, typer.Option(
        help="several seeds, e.g. 0,1,2,3: a run each, and the light p95 waits pooled "
             "over them (instead of --seed)")] = "",
    json_out: Json = False,
) -> None:
    """Fair share vs FIFO: one heavy tenant beside light ones, on the fake engine.

    Jain's index per window over tokens served (each tenant's over its max-min fair
    allocation), the light tenants' p95 queue wait beside the heavy one vs without it."""
    from tokenq.cli.bench.fair import FairConfig, run_fair

    cfg = FairConfig(tenants=tenants, heavy_factor=heavy_factor, light_rate=light_rate,
                     seconds=seconds, window_s=window_s, workers=workers, apis=apis,
                     token_rate=token_rate, max_tokens=max_tokens, seed=seed)
    try:
        several = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{seeds!r}: seeds as 0,1,2,3", param_hint="--seeds") from None
    emit(run_fair(cfg, (lambda _: None) if json_out else typer.echo, several), json_out)


@bench_app.command("eta")
def eta(
    jobs: Annotated[int, typer.Option(help="backlog jobs, submitted at once")] = 200,
    warmup: Annotated[int, typer.Option(help="jobs run first (the pool's pace)")] = 80,
    tenants: Annotated[int, typer.Option(help="tenants, round-robin")] = 4,
    runs: Annotated[int, typer.Option(help="runs, each on a fresh stack")] = 3,
    json_out: Json = False,
) -> None:
    """The eta a job gets at enqueue vs its real start, over a backlog (fake engine).

    p90 relative error |eta - wait| / max(wait, 1 s) and the share within 25%, per run
    and the median of the runs."""
    from tokenq.cli.bench.eta import EtaConfig, run_eta

    cfg = EtaConfig(jobs=jobs, warmup=warmup, tenants=tenants, runs=runs)
    emit(run_eta(cfg, (lambda _: None) if json_out else typer.echo), json_out)


@bench_app.command("placement")
def placement(
    fast_slots: Annotated[int, typer.Option(help="the fast pool's slots")] = 16,
    fast_rate: Annotated[float, typer.Option(help="the fast pool's tokens/s per job")] = 100.0,
    slow_slots: Annotated[int, typer.Option(help="the slow pool's slots")] = 4,
    slow_rate: Annotated[float, typer.Option(help="the slow pool's tokens/s per job")] = 10.0,
    burst: Annotated[int, typer.Option(help="jobs submitted at once per arm")] = 48,
    max_tokens: Annotated[int, typer.Option(help="tokens per job")] = 32,
    runs: Annotated[int, typer.Option(help="runs, each on a fresh stack")] = 3,
    json_out: Json = False,
) -> None:
    """Placement across a model's two pools vs the fast pool alone (fake engine).

    A burst per arm: rejections, TTFT p50/p95, makespan, jobs per pool, and jobs placed
    where they finished >20% later than the other pool's estimate."""
    from tokenq.cli.bench.placement import PlacementConfig, run_placement

    cfg = PlacementConfig(fast_slots=fast_slots, fast_rate=fast_rate, slow_slots=slow_slots,
                          slow_rate=slow_rate, burst=burst, max_tokens=max_tokens, runs=runs)
    emit(run_placement(cfg, (lambda _: None) if json_out else typer.echo), json_out)


@bench_app.command("postcall")
def postcall(
    model: Model = None,
    calls: Annotated[int, typer.Option(help="call transcripts (200-600 tokens each)")] = 200,
    max_tokens: MaxTokens = 256,
    seed: Annotated[int, typer.Option(help="the transcripts' seed")] = 0,
    runs: Annotated[int, typer.Option(min=1, help="runs; the arms alternate")] = 3,
    peers: Annotated[bool, typer.Option(help="also run C++ llama-server")] = True,
    json_out: Json = False,
) -> None:
    """The post-call batch end to end: tokenq's Batch API vs C++ llama-server.

    N transcripts summarised into one JSON schema: makespan, output tok/s, valid summaries
    (parsed and validated against the schema) and those cut at max_tokens, per arm; medians
    over runs and the ratios."""
    from rich.console import Console

    from tokenq.cli.bench.postcall import run_postcall

    settings = settings_or_exit()
    emit(run_postcall(settings, model or settings.default_model, calls, max_tokens, seed,
                      runs, peers, Console(stderr=json_out)), json_out)
