"""Which slot a llama.cpp job gets: the lowest free one, unless another's cached prefix saves
a real share of the prompt (workers/engines/llamacpp_slots.py)."""

from __future__ import annotations

import llama_cpp as ll
import pytest

from tokenq.workers.engines.llamacpp_lora import BASE
from tokenq.workers.engines.llamacpp_slots import SPREAD_MIN_TOKENS, SlotPool

TEMPLATE = list(range(1000, 1000 + 3 * SPREAD_MIN_TOKENS))  # a long shared template


def test_jobs_take_the_lowest_free_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ll, "llama_memory_seq_rm", lambda *_: True)
    p = SlotPool(mem=None, slots=4, prefix_cache=True)
    assert [p.take([1, 2, 3], BASE)[0] for _ in range(3)] == [0, 1, 2]
    p.give_back(1, BASE, [1, 2, 3])
    p.give_back(0, BASE, [5, 6, 7])
    # slot 1 shares 2 tokens, not enough to leave the low ids: the lowest free slot, 0
    assert p.take([1, 2, 9, 9], BASE) == (0, 0)
    assert p.take([1, 2, 9, 9], BASE) == (1, 2)  # now the lowest free one, prefix kept


def test_a_long_cached_prefix_wins_over_the_lowest_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ll, "llama_memory_seq_rm", lambda *_: True)
    p = SlotPool(mem=None, slots=4, prefix_cache=True)
    assert [p.take([1], BASE)[0] for _ in range(3)] == [0, 1, 2]
    p.give_back(2, BASE, [*TEMPLATE, 1, 2])
    p.give_back(0, BASE, [])
    assert p.take([*TEMPLATE, 3, 4], BASE) == (2, len(TEMPLATE))
    # another adapter's KV is not a prefix of this job's
    p.give_back(2, BASE + 1, TEMPLATE)
    assert p.take([*TEMPLATE, 3, 4], BASE) == (0, 0)


def test_cache_prompt_false_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ll, "llama_memory_seq_rm", lambda *_: True)
    p = SlotPool(mem=None, slots=2, prefix_cache=True)
    p.give_back(p.take([1], BASE)[0], BASE, TEMPLATE)
    assert p.take([*TEMPLATE, 5], BASE, fresh=True) == (0, 0)
