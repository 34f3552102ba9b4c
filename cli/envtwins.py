"""Every flag's environment twin is named after the flag: TOKENQ_<COMMAND>_<FLAG>.

Click's automatic name (`auto_envvar_prefix`) comes from the Python parameter instead, so a
flag spelt otherwise (`--min` for `min_workers`, `--json` for `json_out`) would read
TOKENQ_UP_MIN_WORKERS. The root group gives each such option the flag's name as its
variable; typer still reads the parameter's name after it, so the older variable keeps
working as an alias (the flag's name wins when both are set).
"""

from __future__ import annotations

from typing import Any

from typer._click import Command
from typer.core import TyperGroup

PREFIX = "TOKENQ"


def flag_of(opts: list[str]) -> str | None:
    """The option's first long flag (`--max-tokens`), None for a short-only option."""
    return next((o for o in opts if o.startswith("--")), None)


def variable(path: list[str], flag: str) -> str:
    """TOKENQ_<COMMAND...>_<FLAG>, spelt as click spells a command's prefix."""
    return "_".join([PREFIX, *path, flag.lstrip("-")]).upper().replace("-", "_")


def variables_of(param: Any, path: list[str]) -> list[str]:
    """The variables an option reads, first to last: its own, then click's automatic one."""
    own = param.envvar
    names = [own] if isinstance(own, str) else list(own or [])
    if param.allow_from_autoenv and param.name:
        names.append(variable(path, param.name))
    return names


def name_twins(command: Command, path: list[str]) -> None:
    for name, sub in getattr(command, "commands", {}).items():
        name_twins(sub, [*path, name])
    for param in command.params:
        flag = flag_of(list(param.opts)) if param.param_type_name == "option" else None
        if flag is None:
            continue
        twin = variable(path, flag)
        if twin not in variables_of(param, path):
            own = param.envvar
            param.envvar = [twin, *([own] if isinstance(own, str) else list(own or []))]


class FlagTwinGroup(TyperGroup):
    """The root `tokenq` group: its commands' options read TOKENQ_<COMMAND>_<FLAG>."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, command in self.commands.items():
            name_twins(command, [name])
