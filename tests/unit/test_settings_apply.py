"""Every setting does what it says wherever it is set: `log_format` from the TOML file picks
the log lines' format, and no code reads a setting's variable around the settings."""

from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenq.shared import logs
from tokenq.shared.settings import variable_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No TOKENQ_ variable from outside, a fresh working folder (no tokenq.toml), and the
    root logger as it was."""
    for var in [v for v in os.environ if v.upper().startswith("TOKENQ_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def logged_line() -> str:
    """One line logged through the handler logs.configure() installed."""
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    buf = io.StringIO()
    handler.setStream(buf)
    with logs.bind(job_id="job_1"):
        logging.getLogger("tokenq.test").warning("hello")
    return buf.getvalue().strip()


def test_log_format_from_the_toml_file_gives_json_lines(tmp_path: Path) -> None:
    (tmp_path / "tokenq.toml").write_text('log_format = "json"\n')
    logs.configure("INFO")
    line = json.loads(logged_line())
    assert (line["msg"], line["job_id"], line["level"]) == ("hello", "job_1", "warning")
    assert logs.json_wanted()  # a worker then reads each job's tenant for its lines


def test_the_variable_wins_over_the_toml_file(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tokenq.toml").write_text('log_format = "json"\n')
    monkeypatch.setenv("TOKENQ_LOG_FORMAT", "text")
    logs.configure("INFO")
    assert logged_line().endswith("WARNING tokenq.test: hello")
    assert not logs.json_wanted()


def test_the_default_is_text_and_a_named_format_wins() -> None:
    logs.configure("INFO")
    assert not logged_line().startswith("{")
    logs.configure("INFO", fmt="json")
    assert json.loads(logged_line())["msg"] == "hello"


READ = re.compile(r"""(?:environ\.get|environ\[|getenv)\(?\s*["'](TOKENQ_\w+)["']""")


def test_no_code_reads_a_settings_variable_around_the_settings() -> None:
    """A setting read from os.environ ignores the TOML file (log_format did): each one is
    read through Settings."""
    settings_vars = variable_names()
    found = []
    for folder in ("api", "workers", "shared", "cli"):
        for path in (ROOT / folder).rglob("*.py"):
            for var in READ.findall(path.read_text()):
                if var in settings_vars:
                    found.append(f"{path.relative_to(ROOT)}: {var}")
    assert found == []


@pytest.mark.parametrize("toml", ['log_formt = "json"\n', '[worker]\nlease_ttl_sec = 5\n'])
def test_a_toml_key_that_sets_nothing_is_refused_wherever_settings_load(
        tmp_path: Path, toml: str) -> None:
    """Not only by the CLI's check: the API's uvicorn factory reads Settings() itself."""
    from tokenq.shared.settings import Settings

    (tmp_path / "tokenq.toml").write_text(toml)
    with pytest.raises(ValueError, match="unknown key"):
        Settings()


def test_every_toml_setting_is_read(tmp_path: Path) -> None:
    """A setting's key in the TOML file sets that setting (old flat names included)."""
    from tokenq.shared.settings import Settings

    (tmp_path / "tokenq.toml").write_text(
        'log_format = "json"\ntracing = true\nlease_ttl_s = 9\n[api]\ndrain_s = 4\n')
    s = Settings()
    assert (s.log_format, s.tracing, s.worker.lease_ttl_s, s.api.drain_s) == ("json", True, 9, 4)
