"""The settings for a command: loaded once, or one line naming the wrong variable (exit 2)."""

from __future__ import annotations

import typer

from tokenq.shared.settings import Settings, SettingsProblem
from tokenq.shared.settings_load import load_settings


def settings_or_exit(**overrides: object) -> Settings:
    """The settings (with `overrides` that are not None), or one line naming the wrong
    variable and its form on stderr, and exit 2."""
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsProblem as exc:
        typer.echo(f"tokenq: {exc}", err=True)
        raise typer.Exit(2) from None
