"""The protocol's pure parts: the script registry's sources and the heartbeat cutoff."""

from __future__ import annotations

import re

import pytest

from tokenq.shared import keys, lua_scripts
from tokenq.shared.schemas import WorkerHeartbeat, live_workers


def test_every_script_loads_with_includes_and_key_prefixes_resolved() -> None:
    for name in lua_scripts.NAMES:
        src = lua_scripts.source(name)
        assert "--#include" not in src and not re.search(r"@[A-Z_]+@", src), name
        assert src.lstrip().startswith("--"), f"{name}.lua opens with its contract"
    assert "local function end_job" in lua_scripts.source("finish")
    assert keys.BATCH_PREFIX in lua_scripts.source("create")


def test_an_unknown_key_prefix_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lua_scripts, "CONSTANTS", {})
    lua_scripts.source.cache_clear()
    try:
        with pytest.raises(KeyError, match="unknown constant"):
            lua_scripts.source("create")
    finally:
        monkeypatch.undo()
        lua_scripts.source.cache_clear()


def beat(ts: float, model: str = "m") -> str:
    return WorkerHeartbeat(model=model, backend="fake", slots=4, running=1, waiting=0,
                           ts=ts).model_dump_json()


def test_live_workers_keeps_the_fresh_heartbeats_only() -> None:
    raw = {"b:2": beat(95.0), "a:1": beat(100.0, "n"), "c:3": beat(89.9)}
    live = live_workers(raw, ttl_s=10, now=100.0)
    assert list(live) == ["a:1", "b:2"]  # by worker id
    assert live["a:1"].model == "n" and live["b:2"].slots == 4
    assert live_workers(raw, ttl_s=30, now=100.0).keys() == {"a:1", "b:2", "c:3"}
