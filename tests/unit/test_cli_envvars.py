"""Every option of every `tokenq` command reads TOKENQ_<COMMAND>_<FLAG> (docs/cli.md), and
a flag spelt otherwise than its parameter still reads the parameter's old variable."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer._click import Context

from tokenq.cli.main import app


def options(command: Any, ctx: Context) -> Iterator[tuple[Context, Any, str]]:
    """(the command's context, the option, its long flag) of every command, nested ones
    included, each context made as click makes it (its variable prefix from its parent)."""
    for name, sub in getattr(command, "commands", {}).items():
        yield from options(sub, Context(sub, parent=ctx, info_name=name))
    for param in command.params:
        longs = [o for o in param.opts if o.startswith("--")]
        if param.param_type_name == "option" and longs:
            yield ctx, param, longs[0]


def every_option() -> list[tuple[Context, Any, str]]:
    root = typer.main.get_command(app)
    return list(options(root, Context(root, info_name="tokenq", **root.context_settings)))


def rule(ctx: Context, flag: str) -> str:
    words = [c.info_name or "" for c in reversed(list(_chain(ctx)))][1:]  # not "tokenq"
    return "_".join(["TOKENQ", *words, flag.lstrip("-")]).upper().replace("-", "_")


def _chain(ctx: Context | None) -> Iterator[Context]:
    while ctx is not None:
        yield ctx
        ctx = ctx.parent


@pytest.fixture(autouse=True)
def no_tokenq_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.upper().startswith("TOKENQ_")]:
        monkeypatch.delenv(var)


def test_every_flag_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    found = every_option()
    assert len(found) > 50  # the walk reaches the nested commands (jobs, batch, bench)
    wrong = []
    for ctx, param, flag in found:
        var = rule(ctx, flag)
        monkeypatch.setenv(var, "7")
        if param.resolve_envvar_value(ctx) != "7":
            wrong.append(f"{' '.join(c.info_name or '' for c in reversed(list(_chain(ctx))))}"
                         f" {flag}: {var} is not read")
        monkeypatch.delenv(var)
    assert wrong == []


@pytest.mark.parametrize(("command", "flag", "old"), [
    ("up", "--min", "TOKENQ_UP_MIN_WORKERS"),
    ("autoscale", "--max", "TOKENQ_AUTOSCALE_MAX_WORKERS"),
    ("jobs list", "--json", "TOKENQ_JOBS_LIST_JSON_OUT"),
])
def test_the_parameters_old_variable_still_works_and_the_flags_wins(
        monkeypatch: pytest.MonkeyPatch, command: str, flag: str, old: str) -> None:
    prefix = f"TOKENQ_{command.upper().replace(' ', '_')}_"
    ctx, param = next((c, p) for c, p, f in every_option()
                      if f == flag and rule(c, "") == prefix)
    monkeypatch.setenv(old, "3")
    assert param.resolve_envvar_value(ctx) == "3"
    monkeypatch.setenv(rule(ctx, flag), "4")
    assert param.resolve_envvar_value(ctx) == "4"


def test_tokenq_up_min_from_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsed as `tokenq up` parses its arguments: TOKENQ_UP_MIN reaches min_workers."""
    monkeypatch.setenv("TOKENQ_UP_MIN", "2")
    root = typer.main.get_command(app)
    up = root.commands["up"]  # type: ignore[attr-defined]
    ctx = up.make_context("up", [], parent=Context(root, info_name="tokenq",
                                                   **root.context_settings))
    assert ctx.params["min_workers"] == 2
