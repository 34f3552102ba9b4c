"""The flat setting names of the release before role groups, still read for one release.

Settings used to be one flat list (``TOKENQ_LEASE_TTL_S``, ``lease_ttl_s = 5`` in the TOML
file). A setting only one role reads now lives in that role's group (shared/settings.py):
``TOKENQ_WORKER__LEASE_TTL_S``, or ``[worker]`` ``lease_ttl_s = 5``. Each old name below is
still accepted, set into its new place, and its first use in a process logs one warning
naming the new variable. Where both are set the new name wins. Settings that stayed top
level kept their names and are not listed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource, TomlConfigSettingsSource

log = logging.getLogger("tokenq.settings")

# old flat field name: (group, field name in the group)
RENAMED: dict[str, tuple[str, str]] = {
    # api
    "api_keys_file": ("api", "keys_file"),
    "max_body_bytes": ("api", "max_body_bytes"),
    "max_tokens_limit": ("api", "max_tokens_limit"),
    "max_stop_sequences": ("api", "max_stop_sequences"),
    "queue_limit": ("api", "queue_limit"),
    "tenant_max_queued": ("api", "tenant_max_queued"),
    "rate_limit_rps": ("api", "rate_limit_rps"),
    "rate_limit_burst": ("api", "rate_limit_burst"),
    "tokens_per_min": ("api", "tokens_per_min"),
    "max_streams_per_tenant": ("api", "max_streams_per_tenant"),
    "body_timeout_s": ("api", "body_timeout_s"),
    "idempotency_ttl_s": ("api", "idempotency_ttl_s"),
    "api_drain_s": ("api", "drain_s"),
    "access_log": ("api", "access_log"),
    "playground": ("api", "playground"),
    "sse_ping_s": ("api", "sse_ping_s"),
    "sse_send_timeout_s": ("api", "sse_send_timeout_s"),
    "cancel_on_disconnect": ("api", "cancel_on_disconnect"),
    "max_file_bytes": ("api", "max_file_bytes"),
    "max_batch_lines": ("api", "max_batch_lines"),
    "files_dir": ("api", "files_dir"),
    "file_ttl_s": ("api", "file_ttl_s"),
    "batch_chunk": ("api", "batch_chunk"),
    # worker
    "worker_model": ("worker", "model"),
    "worker_threads": ("worker", "threads"),
    "lease_ttl_s": ("worker", "lease_ttl_s"),
    "max_attempts": ("worker", "max_attempts"),
    "heartbeat_s": ("worker", "heartbeat_s"),
    "reconcile_s": ("worker", "reconcile_s"),
    "rescue_after_s": ("worker", "rescue_after_s"),
    "drain_grace_s": ("worker", "drain_grace_s"),
    "worker_metrics_addr": ("worker", "metrics_addr"),
    "worker_metrics_port": ("worker", "metrics_port"),
    "worker_metrics_host": ("worker", "metrics_host"),
    "webhook_secret": ("worker", "webhook_secret"),
    "webhook_timeout_s": ("worker", "webhook_timeout_s"),
    "webhook_max_attempts": ("worker", "webhook_max_attempts"),
    # autoscale
    "autoscale_min": ("autoscale", "min_workers"),
    "autoscale_max": ("autoscale", "max_workers"),
    "autoscale_interval_s": ("autoscale", "interval_s"),
    "autoscale_up_window_s": ("autoscale", "up_window_s"),
    "autoscale_down_window_s": ("autoscale", "down_window_s"),
    "autoscale_cooldown_s": ("autoscale", "cooldown_s"),
    "autoscale_target_per_worker": ("autoscale", "target_per_worker"),
}

_warned: set[str] = set()


def env_name(group: str, field: str) -> str:
    """The variable of a field in a role's group: TOKENQ_WORKER__LEASE_TTL_S."""
    return f"TOKENQ_{group.upper()}__{field.upper()}"


def _warn_once(old: str, new: str) -> None:
    if old not in _warned:
        _warned.add(old)
        log.warning("%s is deprecated and will stop working in the next release: use %s",
                    old, new)


def nest(flat: dict[str, Any], old_name: Callable[[str], str],
         new_name: Callable[[str, str], str]) -> dict[str, Any]:
    """`flat` with each old key moved into its group, unless the group already sets it.
    old_name/new_name spell a key for the warning (a variable or a TOML key)."""
    out = dict(flat)
    for old, (group, field) in RENAMED.items():
        if old not in out:
            continue
        value = out.pop(old)
        _warn_once(old_name(old), new_name(group, field))
        section = out.get(group)
        section = dict(section) if isinstance(section, dict) else {}
        section.setdefault(field, value)
        out[group] = section
    return out


class LegacyEnvSource(PydanticBaseSettingsSource):
    """The old TOKENQ_<FLAT> variables, nested; placed below the current variables."""

    def get_field_value(self, field: FieldInfo,  # noqa: ARG002
                        field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # every value comes from __call__

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items()}
        flat = {old: env[f"TOKENQ_{old.upper()}"] for old in RENAMED
                if f"TOKENQ_{old.upper()}" in env}
        return nest(flat, lambda old: f"TOKENQ_{old.upper()}", env_name)


def unknown_keys(settings_cls: type[BaseModel], data: dict[str, Any]) -> list[str]:
    """The TOML file's keys that set nothing: neither a setting (nor an old flat name) at the
    top, nor a field of its group in a group's table (`worker.lease_ttl_sec`)."""
    fields = settings_cls.model_fields
    unknown = sorted(set(data) - set(fields) - set(RENAMED))
    for group, info in fields.items():
        model, table = info.annotation, data.get(group)
        if isinstance(model, type) and issubclass(model, BaseModel) and isinstance(table, dict):
            unknown += sorted(f"{group}.{k}" for k in set(table) - set(model.model_fields))
    return unknown


class LegacyTomlSource(TomlConfigSettingsSource):
    """The TOML config file, its old top-level keys moved into their groups' tables; a key
    that sets nothing is refused (whoever reads the settings: the CLI says it in one line,
    shared/settings_load.py), never silently ignored."""

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        unknown = unknown_keys(self.settings_cls, data)
        if unknown:
            raise ValueError(f"config file: unknown key {unknown[0]!r}")
        return nest(data, lambda old: f"config key {old!r}",
                    lambda group, field: f"[{group}] {field}")
