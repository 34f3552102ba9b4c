"""Settings for the command line: the TOML file's keys checked, and any error as one line
naming the variable and the form it expects, instead of pydantic's traceback."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from tokenq.shared.settings import GROUPS, Settings, SettingsProblem, config_file
from tokenq.shared.settings_legacy import unknown_keys


def check_config_file() -> None:
    """A missing or unreadable config file, or a key that is no setting, as one line."""
    path = config_file()
    if path is None:
        return
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsProblem(f"TOKENQ_CONFIG_FILE={path}: {exc}") from exc
    unknown = unknown_keys(Settings, data)
    if unknown:
        raise SettingsProblem(f"TOKENQ_CONFIG_FILE={path}: unknown key {unknown[0]!r} (keys "
                              "are setting names such as redis_url, served_models, or a "
                              "role's in its table: [worker] lease_ttl_s)")


# Settings whose value may hold a password: an error names them but does not show it.
_SECRET = frozenset({"redis_url", "redis_sentinel_password"})

# The expected form, for the settings whose type alone does not say it.
_FORMS = {
    "served_models": 'comma-separated model names or a JSON list: a,b or ["a","b"]',
    "redis_url": "redis://[:PASSWORD@]host:6379/0",
}


def load_settings(**overrides: Any) -> Settings:
    """Settings(), with an error that names the variable and the expected form in one line
    instead of pydantic's traceback."""
    try:
        check_config_file()
        settings = Settings(**overrides)
        settings.models()
    except SettingsError as exc:
        m = re.search(r'field "(\w+)"', str(exc))
        field = m.group(1) if m else "?"
        cause = exc.__cause__ or exc
        raise SettingsProblem(f"TOKENQ_{field.upper()}: {cause}; expected "
                              f"{_FORMS.get(field, 'a valid value')}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        # ("worker", "lease_ttl_s") is TOKENQ_WORKER__LEASE_TTL_S
        loc = [str(p) for p in err["loc"]]
        field = "__".join(loc[:2] if loc and loc[0] in GROUPS else loc[:1])
        var = f"TOKENQ_{field.upper()}" if field else "settings"
        form = _FORMS.get(field)
        shown = (f"={err['input']!r}" if field and field not in _SECRET
                 and not isinstance(err["input"], dict) else "")
        msg = err["msg"].removeprefix("Value error, ")
        raise SettingsProblem(f"{var}{shown}: {msg}" + (f"; expected {form}" if form else "")
                              ) from exc
    return settings
