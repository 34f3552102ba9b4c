"""A configuration error at start is one line that names it, and a non-zero exit
(docs/cli.md), from `tokenq up` and from the API process started alone (the API module,
what `tokenq up` and `tokenq api` run, and the documented uvicorn factory). Never a
traceback, never a start in a mode nobody asked for (a key alone once became tenant
`default`; an empty key once meant no keys, every caller the admin)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tokenq.cli.stack import INSTALLED, ROOT, python_module
from tokenq.shared.redis_server import free_port

SECRET = "s3cret-key"  # never printed
NOBODY = "redis://127.0.0.1:1/0"  # a valid URL where no Redis listens

# (variable, value, what the one line says)
BAD = [
    ("TOKENQ_API_KEYS", SECRET, "TOKENQ_API_KEYS entry 1: no tenant"),
    ("TOKENQ_API_KEYS", f"{SECRET}::admin", "TOKENQ_API_KEYS entry 1: the tenant is empty"),
    ("TOKENQ_API_KEYS", ":acme", "TOKENQ_API_KEYS entry 1 (tenant 'acme'): the key is empty"),
    ("TOKENQ_API_KEYS", f"{SECRET}:acme:superuser",
     "TOKENQ_API_KEYS entry 1 (tenant 'acme'): unknown role 'superuser'"),
    ("TOKENQ_API__KEYS_FILE", "/nonexistent/keys",
     "TOKENQ_API__KEYS_FILE=/nonexistent/keys: cannot read it"),
    ("TOKENQ_REDIS_URL", "notaurl", "TOKENQ_REDIS_URL: Redis URL must specify"),
    ("TOKENQ_API__QUEUE_LIMIT", "x", "TOKENQ_API__QUEUE_LIMIT='x'"),
]
BAD_IDS = [f"{name}={value}" for name, value, _ in BAD]


def _module(module: str, *args: str) -> list[str]:
    return python_module(module, *args, "--port", str(free_port()))


# Every bad setting through the API module; the uvicorn factory and `tokenq up` share its
# code (app_from_env, settings and keys) and are run with one key and one setting each.
CASES = [("api-module", *bad) for bad in BAD] + [
    (entry, *BAD[i]) for entry in ("uvicorn-factory", "tokenq-up") for i in (0, 5)]
COMMANDS = {
    "api-module": lambda: _module("tokenq.api.server"),
    "uvicorn-factory": lambda: _module("uvicorn", "tokenq.api.app:app_from_env", "--factory"),
    "tokenq-up": lambda: _module("tokenq.cli.main", "up"),
}


def _env(tmp_path: Path, name: str, value: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENQ_")}
    env.update({"TOKENQ_STATE_DIR": str(tmp_path / "state"), "TOKENQ_REDIS_URL": NOBODY,
                name: value})
    if not INSTALLED:  # python -P: this checkout, as the stack's children import it
        env["PYTHONPATH"] = str(ROOT)
    return env


def test_the_api_process_with_a_bad_setting_exits_with_one_line(tmp_path: Path) -> None:
    """All cases at once (each process needs a second or two to import); one that starts
    instead of refusing is cut at the timeout and reported."""
    procs: list[tuple[str, str, subprocess.Popen[str]]] = []
    try:
        wrong = _one_line_each(tmp_path, procs)
    finally:  # none outlives the test, whatever stopped it
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not wrong, "\n".join(wrong)


def _one_line_each(tmp_path: Path, procs: list[tuple[str, str, subprocess.Popen[str]]]
                   ) -> list[str]:
    """Start every case into `procs`; what each did wrong (none: the list is empty)."""
    for n, (entry, name, value, says) in enumerate(CASES):
        cwd = tmp_path / f"cwd{n}"  # no tokenq.toml of the caller's
        cwd.mkdir()
        procs.append((f"{entry} {name}={value!r}", says, subprocess.Popen(
            COMMANDS[entry](), env=_env(tmp_path, name, value), cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)))
    wrong = []
    deadline = time.monotonic() + 90  # for all of them: they run side by side
    for what, says, proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            wrong.append(f"{what}: still running after 90 s: {err[-500:]!r}")
            continue
        lines = err.strip().splitlines()
        if proc.returncode == 0 or len(lines) != 1 or says not in lines[0] or out.strip():
            wrong.append(f"{what}: exit {proc.returncode}, {len(lines)} line(s) on stderr: "
                         f"{err[-600:]!r}, stdout {out[-200:]!r}")
        elif not lines[0].startswith("tokenq: ") or SECRET in err + out:
            wrong.append(f"{what}: {lines[0]!r}")
    return wrong


@pytest.mark.parametrize(("name", "value", "says"), BAD, ids=BAD_IDS)
def test_tokenq_up_refuses_before_starting_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    """`tokenq up` checks the API's settings and keys itself: exit 2 with the line, before
    Redis or any child starts (a Stack made here fails the test)."""
    from tokenq.cli import main, stack

    class NoStack:
        def __init__(self, *_: object, **__: object) -> None:
            raise AssertionError("tokenq up started the stack")

    monkeypatch.setattr(stack, "Stack", NoStack)
    monkeypatch.setattr(main, "_logging", lambda *_: None)
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("TOKENQ_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TOKENQ_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv(name, value)
    got = CliRunner().invoke(main.app, ["up", "--port", "8301"])
    assert got.exit_code == 2, (got.exit_code, got.output, got.exception)
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenq: ") and says in lines[0], lines
    assert SECRET not in got.output


def test_app_from_env_refuses_a_bad_key_entry_without_redis_or_traceback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tokenq.api.app import app_from_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENQ_REDIS_URL", NOBODY)
    monkeypatch.setenv("TOKENQ_API_KEYS", f"k1:acme,{SECRET}")
    with pytest.raises(SystemExit, match=r"^tokenq: TOKENQ_API_KEYS entry 2: no tenant"):
        app_from_env()
    monkeypatch.delenv("TOKENQ_API_KEYS")
    monkeypatch.delenv("TOKENQ_REDIS_URL")
    with pytest.raises(SystemExit, match=r"^tokenq: TOKENQ_REDIS_URL is not set"):
        app_from_env()
    monkeypatch.setenv("TOKENQ_REDIS_URL", NOBODY)
    monkeypatch.setenv("TOKENQ_API_KEYS", "k1:acme:metrics, k2:ops:admin")
    assert app_from_env().state.api_keys_configured


@pytest.mark.parametrize(("url", "says"), [
    ("notaurl", "Redis URL must specify one of the following schemes"),
    ("redis://:pw-s3cret-key@redis:abc/0", "Port could not be cast to integer"),
    ("redis://:pw-s3cret-key@redis:6379/0?socket_timeout=x", "'socket_timeout'"),
])
def test_a_bad_redis_url_names_the_variable_not_its_password(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, says: str) -> None:
    from tokenq.shared.settings import SettingsProblem
    from tokenq.shared.settings_load import load_settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENQ_REDIS_URL", url)
    with pytest.raises(SettingsProblem) as got:
        load_settings()
    msg = str(got.value)
    assert msg.startswith("TOKENQ_REDIS_URL: ") and says in msg and SECRET not in msg, msg


@pytest.mark.parametrize("command", [["worker"], ["autoscale", "--min", "0"]])
def test_a_command_joining_a_stack_without_its_redis_says_so_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    """`tokenq worker` and `tokenq autoscale` join a running stack: without
    TOKENQ_REDIS_URL each stops with one line naming it (exit 2), not a traceback from
    deep in the worker or the autoscaler."""
    from tokenq.cli import main

    monkeypatch.setattr(main, "_logging", lambda *_: None)
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("TOKENQ_")]:
        monkeypatch.delenv(key)
    got = CliRunner().invoke(main.app, command)
    assert got.exit_code == 2, (got.exit_code, got.output, got.exception)
    lines = got.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tokenq: TOKENQ_REDIS_URL is not set"), lines
