"""The settings for a command: loaded once, or one line naming the wrong variable (exit 2)."""

from __future__ import annotations

import typer

from tokenq.shared.settings import NO_REDIS_URL, Settings, SettingsProblem
from tokenq.shared.settings_load import load_settings


def settings_or_exit(*, need_redis: bool = False, **overrides: object) -> Settings:
    """The settings (with `overrides` that are not None), or one line naming the wrong
    variable and its form on stderr, and exit 2. `need_redis`: a command that joins a
    running stack (a worker, the autoscaler) also stops so when TOKENQ_REDIS_URL is unset."""
    try:
        settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
        if need_redis and not settings.redis_url:
            raise SettingsProblem(NO_REDIS_URL)
    except SettingsProblem as exc:
        typer.echo(f"tokenq: {exc}", err=True)
        raise typer.Exit(2) from None
    return settings
