"""The llama.cpp engine's host-memory prompt cache: what it keeps, finds and lets go.

llama.cpp's state copy is replaced by a stand-in whose size follows the token count: the
bounds are what is tested here; the copy itself on a real model is tested in
tests/integration/test_llamacpp_engine.py."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from tokenq.workers.engines import llamacpp_ramcache as rc
from tokenq.workers.engines.llamacpp_ramcache import MIN_TOKENS, RamCache

PER_TOKEN = 1000  # bytes a cached token costs in the stand-in


@pytest.fixture
def cells(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """seq id -> how many tokens its cells hold; set_data writes it back."""
    held: dict[int, int] = {}

    def size(_ctx: Any, seq: int) -> int:
        return held[seq] * PER_TOKEN

    def get(_ctx: Any, buf: Any, n: int, seq: int) -> int:
        ctypes.memmove(buf, held[seq].to_bytes(8, "little"), 8)
        return n

    def put(_ctx: Any, buf: Any, n: int, seq: int) -> int:
        held[seq] = int.from_bytes(bytes(buf[:8]), "little")
        return n

    monkeypatch.setattr(rc.ll, "llama_state_seq_get_size", size)
    monkeypatch.setattr(rc.ll, "llama_state_seq_get_data", get)
    monkeypatch.setattr(rc.ll, "llama_state_seq_set_data", put)
    return held


def test_saves_finds_the_longest_prefix_and_restores_once(cells: dict[int, int]) -> None:
    cache = RamCache(ctx=None, budget_bytes=10 * MIN_TOKENS * PER_TOKEN)
    a = list(range(100))
    b = list(range(1000, 1000 + MIN_TOKENS))
    cells[0] = len(a)
    assert cache.save(0, 0, a)
    cells[0] = len(b)
    assert cache.save(0, 0, b)
    assert not cache.save(0, 0, a[:MIN_TOKENS])  # held already (as a prefix of a)
    assert not cache.save(0, 0, list(range(5000, 5000 + MIN_TOKENS - 1)))  # too short
    key, n = cache.best([*a[:80], 7, 7, 7], group=0)
    assert key is not None and n == 80
    assert cache.best(a, group=1) == (None, 0)  # another adapter's cells are other KV
    cells[3] = 0
    assert cache.restore(key, 3) and cells[3] == len(a)
    assert cache.best(a, group=0)[1] == 0 and len(cache) == 1  # it left the cache


def test_a_longer_entry_replaces_its_prefix_and_the_budget_evicts_the_oldest(
        cells: dict[int, int]) -> None:
    cache = RamCache(ctx=None, budget_bytes=3 * 100 * PER_TOKEN)
    base = list(range(100))
    cells[0] = 100
    cache.save(0, 0, base)
    cells[0] = 150
    cache.save(0, 0, base + list(range(50)))  # extends the first: one entry left
    assert len(cache) == 1 and cache.used_bytes == 150 * PER_TOKEN
    for i in range(3):  # 100 tokens each: the oldest go first
        cells[0] = 100
        cache.save(0, 0, [10_000 * (i + 1) + t for t in range(100)])
    assert cache.used_bytes <= cache.budget_bytes and len(cache) == 3
    assert cache.best(base, 0)[1] == 0  # the 150-token entry was evicted first
    cells[0] = 400
    assert not cache.save(0, 0, list(range(400)))  # bigger than the whole budget
    assert not RamCache(ctx=None, budget_bytes=0).save(0, 0, base)  # off
