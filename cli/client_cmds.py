"""`tokenq jobs …` and `tokenq batch …`: the client from the command line.

Every command takes --url (TOKENQ_BASE_URL; several replicas comma-separated) and
--api-key (TOKENQ_API_KEY)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import httpx
import typer

from tokenq.client import (
    APIError,
    Batch,
    Client,
    DoneEvent,
    ErrorEvent,
    QueuedEvent,
    StreamGaveUp,
    TokenEvent,
)

UrlOpt = Annotated[str | None, typer.Option(
    "--url", envvar="TOKENQ_BASE_URL",
    help="API base URL; several replicas comma-separated \\[default: http://127.0.0.1:8000]")]
KeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar="TOKENQ_API_KEY", help="API key (Bearer)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON")]

jobs_app = typer.Typer(no_args_is_help=True, help="Submit, watch, cancel and list jobs.")
batch_app = typer.Typer(no_args_is_help=True, help="Batches over the Files/Batch API.")


def _client(url: str | None, api_key: str | None) -> Client:
    return Client(url, api_key=api_key)


@contextmanager
def _errors(url: str | None) -> Iterator[None]:
    """An API error or an unreachable API as one line on stderr, exit 1."""
    try:
        yield
    except APIError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    except (httpx.TransportError, StreamGaveUp) as exc:
        typer.echo(f"error: cannot reach the API at {url or 'http://127.0.0.1:8000'}: "
                   f"{exc or type(exc).__name__}", err=True)
        raise typer.Exit(1) from None


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"{p!r}: expected KEY=VALUE", param_hint="--metadata")
        out[k] = v
    return out


def queued_line(ev: QueuedEvent) -> str:
    """A `queued` event as `tokenq jobs watch` prints it (stderr)."""
    eta = "unknown" if ev.eta_s is None else f"{ev.eta_s:.1f} s"
    pos = "?" if ev.position is None else str(ev.position)
    return f"queued ({ev.reason or 'waiting'}): {pos} jobs ahead, starts in {eta}"


def _watch(tq: Client, job_id: str, last_event_id: str | None = None) -> int:
    """Tokens to stdout as they come (resumed across drops), each `queued` update's
    position and eta to stderr; 0 when the job succeeded."""
    code = 1
    for ev in tq.stream(job_id, last_event_id=last_event_id):
        if isinstance(ev, TokenEvent):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, DoneEvent):
            code = 0
        elif isinstance(ev, ErrorEvent):
            typer.echo(f"\nerror: {ev.code}: {ev.message}", err=True)
        elif isinstance(ev, QueuedEvent):
            typer.echo(queued_line(ev), err=True)
        elif ev.type == "cancelled":
            typer.echo("\ncancelled", err=True)
    sys.stdout.write("\n")
    return code


@jobs_app.command("submit")
def jobs_submit(
    model: Annotated[str, typer.Argument(help="a served model (or LoRA adapter)")],
    prompt: Annotated[str, typer.Argument(help="the prompt; '-' reads stdin")],
    chat: Annotated[bool, typer.Option("--chat", help="send as one user chat message")]
    = False,
    max_tokens: Annotated[int | None, typer.Option()] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    priority: Annotated[str, typer.Option(help="high, normal or low")] = "normal",
    metadata: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable)")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="retry-safe key")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="stream the tokens")] = False,
    url: UrlOpt = None, api_key: KeyOpt = None, json_out: JsonOpt = False,
) -> None:
    """Submit a job; prints its id (or, with --watch, its tokens as they come)."""
    text = sys.stdin.read() if prompt == "-" else prompt
    with _client(url, api_key) as tq, _errors(url):
        job = tq.submit(model, None if chat else text,
                        messages=[{"role": "user", "content": text}] if chat else None,
                        max_tokens=max_tokens, temperature=temperature, priority=priority,
                        metadata=_metadata(metadata), idempotency_key=idempotency_key)
        if not watch:
            typer.echo(job.model_dump_json() if json_out else job.id)
            return
        typer.echo(f"{job.id}", err=True)
        raise typer.Exit(_watch(tq, job.id))


@jobs_app.command("watch")
def jobs_watch(job_id: str, last_event_id: Annotated[str | None, typer.Option(
        help="resume after this event id")] = None,
               url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Stream a job's tokens to the end, resuming across dropped connections."""
    with _client(url, api_key) as tq, _errors(url):
        raise typer.Exit(_watch(tq, job_id, last_event_id))


@jobs_app.command("cancel")
def jobs_cancel(job_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel a job (idempotent); prints its state after."""
    with _client(url, api_key) as tq, _errors(url):
        typer.echo(f"{job_id}\t{tq.cancel(job_id).status}")


@jobs_app.command("list")
def jobs_list(
    state: Annotated[str | None, typer.Option(help="queued, running, succeeded, …")] = None,
    model: Annotated[str | None, typer.Option()] = None,
    metadata: Annotated[list[str] | None, typer.Option(help="KEY=VALUE (repeatable)")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 20,
    url: UrlOpt = None, api_key: KeyOpt = None, json_out: JsonOpt = False,
) -> None:
    """This API key's jobs, newest first."""
    from rich.console import Console
    from rich.table import Table

    with _client(url, api_key) as tq, _errors(url):
        jobs = []
        for job in tq.iter_jobs(state=state, model=model, metadata=_metadata(metadata),
                                limit=min(limit, 100)):
            jobs.append(job)
            if len(jobs) >= limit:
                break
    if json_out:
        typer.echo(json.dumps([j.model_dump(mode="json") for j in jobs]))
        return
    table = Table("id", "status", "model", "tokens", "created")
    for j in jobs:
        import datetime as dt

        created = dt.datetime.fromtimestamp(j.created_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(j.id, j.status, j.model,
                      str(j.usage.completion_tokens) if j.usage else "", created)
    Console().print(table)


def _progress_bar(tq: Client, b: Batch) -> Batch:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]} failed"), transient=False) as bar:
        task = bar.add_task(b.status, total=None, failed=0)

        def show(now: Batch) -> None:
            c = now.request_counts
            bar.update(task, description=f"{now.id} {now.status}",
                       total=c.total or None, completed=c.completed + c.failed,
                       failed=c.failed)

        return tq.wait_batch(b.id, on_progress=show, poll_s=0.5)


@batch_app.command("submit")
def batch_submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                         help="JSONL: one Batch API request per line")],
    endpoint: Annotated[str, typer.Option()] = "/v1/chat/completions",
    watch: Annotated[bool, typer.Option("--watch", help="follow it with a progress bar")]
    = False,
    url: UrlOpt = None, api_key: KeyOpt = None, json_out: JsonOpt = False,
) -> None:
    """Upload FILE and start a batch over it; prints the batch id (or follows it)."""
    with _client(url, api_key) as tq, _errors(url):
        b = tq.submit_batch(file, endpoint=endpoint)
        if watch:
            b = _progress_bar(tq, b)
    typer.echo(b.model_dump_json() if json_out else f"{b.id}\t{b.status}\t"
               f"{b.request_counts.completed}/{b.request_counts.total} completed, "
               f"{b.request_counts.failed} failed")
    if watch and b.status != "completed":
        _why(b)
        raise typer.Exit(1)


@batch_app.command("watch")
def batch_watch(batch_id: str, url: UrlOpt = None, api_key: KeyOpt = None) -> None:
    """Follow a batch to its end with a progress bar."""
    with _client(url, api_key) as tq, _errors(url):
        b = _progress_bar(tq, tq.get_batch(batch_id))
    typer.echo(f"{b.id}\t{b.status}")
    if b.status != "completed":
        _why(b)
        raise typer.Exit(1)


SHOWN_ERRORS = 10  # a failed batch's errors printed by --watch (the rest: --json)


def _why(b: Batch) -> None:
    """A batch that did not complete: its errors (a line each, the first SHOWN_ERRORS) on
    stderr, as the API gave them (`errors.data`: line, code, message)."""
    data = (b.errors or {}).get("data") or []
    for e in data[:SHOWN_ERRORS]:
        where = f"line {e['line']}: " if e.get("line") is not None else ""
        typer.echo(f"{where}{e.get('code') or 'error'}: {e.get('message', '')}", err=True)
    if len(data) > SHOWN_ERRORS:
        typer.echo(f"... and {len(data) - SHOWN_ERRORS} more (--json shows them all)",
                   err=True)
