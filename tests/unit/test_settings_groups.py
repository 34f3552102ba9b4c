"""Settings nested by role: TOKENQ_<ROLE>__<NAME>, the old flat names still read (with a
warning naming the new variable), and the TOML file's tables."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from tokenq.shared import settings_legacy
from tokenq.shared.settings import Settings, SettingsProblem, variable_names
from tokenq.shared.settings_legacy import RENAMED, env_name
from tokenq.shared.settings_load import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No TOKENQ_ variable from outside, no tokenq.toml, and every old name not yet warned."""
    for var in [v for v in os.environ if v.upper().startswith("TOKENQ_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(settings_legacy, "_warned", set())


def test_new_nested_names_set_each_roles_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_WORKER__LEASE_TTL_S", "7")
    monkeypatch.setenv("TOKENQ_AUTOSCALE__MAX_WORKERS", "9")
    monkeypatch.setenv("TOKENQ_API__DRAIN_S", "3")
    monkeypatch.setenv("TOKENQ_RESULT_TTL_S", "60")
    s = Settings()
    assert (s.worker.lease_ttl_s, s.autoscale.max_workers, s.api.drain_s) == (7, 9, 3)
    assert s.result_ttl_s == 60
    assert s.worker.heartbeat_s == 2.0  # the group's other fields keep their defaults


def test_an_old_flat_name_still_works_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TOKENQ_LEASE_TTL_S", "7")
    monkeypatch.setenv("TOKENQ_AUTOSCALE_MAX", "9")
    with caplog.at_level(logging.WARNING, logger="tokenq.settings"):
        s = Settings()
        Settings()
    assert s.worker.lease_ttl_s == 7 and s.autoscale.max_workers == 9
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert any("TOKENQ_LEASE_TTL_S" in w and "TOKENQ_WORKER__LEASE_TTL_S" in w
               for w in warnings)
    assert any("TOKENQ_AUTOSCALE_MAX" in w and "TOKENQ_AUTOSCALE__MAX_WORKERS" in w
               for w in warnings)


def test_the_new_name_wins_over_the_old(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_DRAIN_GRACE_S", "5")
    monkeypatch.setenv("TOKENQ_WORKER__DRAIN_GRACE_S", "1")
    monkeypatch.setenv("TOKENQ_HEARTBEAT_S", "0.5")  # an old name beside a new one of its group
    s = Settings()
    assert s.worker.drain_grace_s == 1
    assert s.worker.heartbeat_s == 0.5


def test_every_old_name_maps_to_a_field() -> None:
    names = variable_names()
    for old, (group, field) in RENAMED.items():
        assert env_name(group, field) in names, old
        assert f"TOKENQ_{old.upper()}" not in names, old


def test_the_operators_table_of_renamed_variables_matches_the_code() -> None:
    """docs/operations.md lists the old names that are not just the new one without its
    group; a global search-and-replace once made both columns the new name."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    rows = dict(re.findall(r"^\| `(TOKENQ_[A-Z_]+)` \| `(TOKENQ_[A-Z_]+)` \|$", doc, re.M))
    renamed = {f"TOKENQ_{old.upper()}": env_name(group, field)
               for old, (group, field) in RENAMED.items() if old != field}
    assert rows == renamed


def test_the_toml_file_takes_tables_and_old_flat_keys(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "tokenq.toml").write_text(
        'result_ttl_s = 60\nsse_ping_s = 3\n[worker]\nlease_ttl_s = 5\n')
    s = load_settings()
    assert (s.result_ttl_s, s.api.sse_ping_s, s.worker.lease_ttl_s) == (60, 3, 5)
    monkeypatch.setenv("TOKENQ_WORKER__LEASE_TTL_S", "8")  # variables win over the file
    assert load_settings().worker.lease_ttl_s == 8


def test_a_misspelt_toml_key_in_a_table_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tokenq.toml").write_text('[worker]\nlease_ttl = 5\n')
    with pytest.raises(SettingsProblem, match=r"unknown key 'worker\.lease_ttl'"):
        load_settings()


def test_a_bad_nested_value_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENQ_API__QUEUE_LIMIT", "x")
    with pytest.raises(SettingsProblem, match="TOKENQ_API__QUEUE_LIMIT='x'"):
        load_settings()
