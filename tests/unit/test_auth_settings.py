"""API keys parsing and the Redis password rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenq.api.auth import bearer, hash_key, load_keys_file, parse_keys
from tokenq.shared.settings import Settings, SettingsProblem


def test_env_keys_map_hashes_to_tenants_and_roles() -> None:
    keys = parse_keys("k1:acme, k2:ops:admin,k3 : zeta ,")  # blanks around parts, a last comma
    assert keys[hash_key("k1")].tenant == "acme" and not keys[hash_key("k1")].admin
    assert keys[hash_key("k2")].admin
    assert keys[hash_key("k3")].tenant == "zeta"
    assert "k1" not in keys  # only hashes are kept
    assert parse_keys(None) == parse_keys("") == {}  # no keys: the loopback-only mode


@pytest.mark.parametrize(("raw", "says"), [
    # a key alone would be tenant `default`, shared with every other such key
    ("s3cret-a", "entry 1: no tenant"),
    ("k1:acme,s3cret-a", "entry 2: no tenant"),
    # an empty tenant field, with or without roles
    ("s3cret-a::admin", "entry 1: the tenant is empty"),
    ("k1:acme, s3cret-a: ", "entry 2: the tenant is empty"),
    # an empty key: once the no-keys mode, where every caller is the admin
    (":acme", "entry 1 (tenant 'acme'): the key is empty"),
    ("k1:acme,,  :ops:admin", "entry 3 (tenant 'ops'): the key is empty"),
    # set, yet no entry at all: also the no-keys mode
    (" , ", "TOKENQ_API_KEYS has no entries"),
    # a role or a weight names its entry too
    ("k1:acme,s3cret-a:ops:superuser", "entry 2 (tenant 'ops'): unknown role 'superuser'"),
    ("s3cret-a:ops:weight=0", "entry 1 (tenant 'ops'): weight='0'"),
    # one key for two tenants: which one it served was an accident of order
    ("s3cret-a:acme,k2:zeta,s3cret-a:ops",
     "entry 3 (tenant 'ops'): the same key as TOKENQ_API_KEYS entry 1 (tenant 'acme')"),
    ("s3cret-a:acme,s3cret-a:acme:admin", "entry 2 (tenant 'acme'): the same key as"),
])
def test_a_malformed_key_entry_is_refused_naming_it_not_its_key(raw: str, says: str) -> None:
    with pytest.raises(SettingsProblem) as got:
        parse_keys(raw)
    msg = str(got.value)
    assert msg.startswith("TOKENQ_API_KEYS") and says in msg, msg
    assert "s3cret" not in msg and "\n" not in msg


def test_keys_file_problems_are_one_line_naming_the_variable(tmp_path: Path) -> None:
    from tokenq.api.auth import load_keys

    missing = tmp_path / "nope"
    with pytest.raises(SettingsProblem) as got:
        load_keys(None, missing)
    assert str(got.value) == (f"TOKENQ_API__KEYS_FILE={missing}: cannot read it "
                              "(No such file or directory)")
    with pytest.raises(SettingsProblem, match=r"TOKENQ_API__KEYS_FILE=.*cannot read it"):
        load_keys(None, tmp_path)  # a directory
    path = tmp_path / "keys"
    path.write_text(f"sha256:{hash_key('k')} acme superuser\n")
    with pytest.raises(SettingsProblem) as got:
        load_keys(None, path)
    assert str(got.value).startswith(f"TOKENQ_API__KEYS_FILE {path}:1: unknown role")
    path.write_text(f"sha256:{hash_key('k')} acme weight=2\n")
    with pytest.raises(SettingsProblem, match="different weights"):
        load_keys("k3:acme:weight=3", path)


def test_keys_file_rejects_plain_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("plain-secret acme\n")
    with pytest.raises(ValueError, match="sha256"):
        load_keys_file(path)


def test_bearer_header_parsing() -> None:
    assert bearer([(b"authorization", b"Bearer abc ")]) == "abc"
    assert bearer([(b"authorization", b"Basic abc")]) is None
    assert bearer([(b"authorization", b"Bearer")]) is None
    assert bearer([]) is None


@pytest.mark.parametrize(("url", "env", "ok"), [
    ("redis://127.0.0.1:6379/0", "dev", True),  # embedded / local dev
    ("redis://localhost:6379/0", "dev", True),
    ("redis://redis:6379/0", "dev", False),  # another host without a password
    ("redis://:pw@redis:6379/0", "dev", True),
    ("redis://user:pw@10.0.0.5:6379/0", "production", True),
    ("redis://127.0.0.1:6379/0", "production", False),  # production: always a password
    ("unix:///run/redis.sock", "production", True),
])
def test_redis_outside_loopback_needs_a_password(url: str, env: str, ok: bool) -> None:
    if ok:
        Settings(redis_url=url, env=env)
    else:
        with pytest.raises(ValidationError, match="password"):
            Settings(redis_url=url, env=env)


def test_production_refuses_to_start_without_keys(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Production without keys fails at start, naming what to set, on every way in (the
    `tokenq api` server and the uvicorn factory): never a silent loopback bind."""
    from tokenq.api.app import app_from_env, create_app
    from tokenq.shared.settings import get_settings

    prod = Settings(redis_url="redis://:pw@redis:6379/0", env="production")
    with pytest.raises(SystemExit, match="TOKENQ_API__KEYS_FILE"):
        create_app(prod)
    monkeypatch.setenv("TOKENQ_ENV", "production")
    monkeypatch.setenv("TOKENQ_REDIS_URL", "redis://:pw@redis:6379/0")
    monkeypatch.delenv("TOKENQ_API_KEYS", raising=False)
    monkeypatch.delenv("TOKENQ_API__KEYS_FILE", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(SystemExit, match="needs API keys"):
            app_from_env()
        keys = tmp_path / "keys"
        keys.write_text(f"sha256:{hash_key('k')} acme\n")
        monkeypatch.setenv("TOKENQ_API__KEYS_FILE", str(keys))
        get_settings.cache_clear()
        assert app_from_env().state.api_keys_configured
    finally:
        get_settings.cache_clear()


def test_fair_share_weights_on_key_entries(tmp_path: Path) -> None:
    from tokenq.api.auth import load_keys

    got = parse_keys("k1:acme:high+weight=2.5,k2:zeta")
    assert got[hash_key("k1")].weight == 2.5 and got[hash_key("k1")].high
    assert got[hash_key("k2")].weight == 1.0
    path = tmp_path / "keys"
    for bad in ("weight=0", "weight=-1", "weight=nan", "weight=x", "weight=1001",
                "weight=1 weight=2"):
        path.write_text(f"sha256:{hash_key('k')} acme {bad}\n")
        with pytest.raises(ValueError, match="weight"):
            load_keys_file(path)
    path.write_text(f"sha256:{hash_key('k')} acme weight=2\n")
    with pytest.raises(ValueError, match="different weights"):  # the API refuses to start
        load_keys("k3:acme:weight=3", path)
    assert load_keys("k3:acme:weight=2", path)[hash_key("k3")].weight == 2


def test_one_key_for_two_tenants_across_the_variable_and_the_file_is_refused(
        tmp_path: Path) -> None:
    from tokenq.api.auth import load_keys

    path = tmp_path / "keys"
    path.write_text(f"sha256:{hash_key('s3cret-k')} zeta\n")
    with pytest.raises(SettingsProblem) as got:
        load_keys("s3cret-k:acme", path)
    assert "a key also in TOKENQ_API_KEYS" in str(got.value)
    assert "s3cret" not in str(got.value)
    path.write_text(f"sha256:{hash_key('s3cret-k')} zeta\nsha256:{hash_key('s3cret-k')} acme\n")
    with pytest.raises(SettingsProblem, match=r":2: the same key as TOKENQ_API__KEYS_FILE"):
        load_keys_file(path)
    # the same entry twice is no conflict
    assert parse_keys("s3cret-k:acme,s3cret-k:acme")[hash_key("s3cret-k")].tenant == "acme"
