"""The autoscaler's decision: recommendation, clamp, stabilisation windows, cooldown."""

from __future__ import annotations

import pytest

from tokenq.cli.scaling import Decider, Inputs, Policy, recommend


def inp(depth: int = 0, running: int = 0, current: int = 0, slots: int = 4,
        external: int = 0) -> Inputs:
    return Inputs(depth=depth, running=running, free_slots=0, slots_per_worker=slots,
                  current=current, external=external)


@pytest.mark.parametrize(("depth", "running", "slots", "want"), [
    (0, 0, 4, 0),
    (1, 0, 4, 1),  # one job needs a worker (ceil, not round)
    (4, 0, 4, 1),
    (5, 0, 4, 2),
    (3, 2, 4, 2),  # running jobs hold their workers
    (100, 0, 4, 3),  # clamped to max
])
def test_recommend_is_ceil_of_backlog_per_slot_clamped(depth: int, running: int, slots: int,
                                                       want: int) -> None:
    assert recommend(inp(depth, running, slots=slots), Policy(min_workers=0, max_workers=3)) \
        == want


def test_recommend_respects_min_external_workers_and_target() -> None:
    assert recommend(inp(), Policy(min_workers=2, max_workers=5)) == 2
    # two live workers that someone else runs already cover 8 of 12 jobs
    assert recommend(inp(depth=12, external=2), Policy(max_workers=5)) == 1
    assert recommend(inp(depth=6, slots=8), Policy(max_workers=5, target_per_worker=2)) == 3


def test_policy_refuses_min_above_max() -> None:
    with pytest.raises(ValueError):
        Policy(min_workers=3, max_workers=2)


def test_burst_scales_up_at_once_and_holds_through_the_down_window() -> None:
    d = Decider(Policy(max_workers=3, down_window_s=10, cooldown_s=0))
    up = d.decide(inp(depth=12, current=0), now=0)
    assert (up.target, up.reason) == (3, "scale_up")
    # the queue empties: the window still holds the burst's recommendation
    for t in (1, 5, 9.9):
        hold = d.decide(inp(current=3), now=t)
        assert (hold.target, hold.raw, hold.reason) == (3, 0, "stabilising")
    down = d.decide(inp(current=3), now=10.5)
    assert (down.target, down.reason) == (0, "scale_down")


def test_down_window_takes_the_highest_recent_recommendation() -> None:
    d = Decider(Policy(max_workers=4, down_window_s=10, cooldown_s=0))
    d.decide(inp(depth=16, current=4), now=0)  # 4
    d.decide(inp(depth=8, current=4), now=6)  # 2
    assert d.decide(inp(depth=0, current=4), now=8).target == 4  # 4 still in the window
    assert d.decide(inp(depth=0, current=4), now=11).target == 2  # the 2 from t=6 remains
    assert d.decide(inp(depth=0, current=2), now=17).target == 0


def test_up_window_takes_the_lowest_recent_recommendation() -> None:
    d = Decider(Policy(max_workers=4, up_window_s=5, down_window_s=0, cooldown_s=0))
    assert d.decide(inp(depth=0, current=0), now=0).target == 0
    # a one-tick spike inside the window does not start workers
    assert d.decide(inp(depth=16, current=0), now=1).target == 0
    assert d.decide(inp(depth=16, current=0), now=5.5).target == 4  # sustained for the window


def test_cooldown_blocks_scale_down_after_a_change_but_not_scale_up() -> None:
    d = Decider(Policy(max_workers=4, down_window_s=0, cooldown_s=20))
    assert d.decide(inp(depth=4, current=0), now=0).target == 1
    assert d.decide(inp(depth=8, current=1), now=1).target == 2  # up is never held
    held = d.decide(inp(current=2), now=15)
    assert (held.target, held.raw, held.reason) == (2, 0, "cooldown")
    assert d.decide(inp(current=2), now=21.5).target == 0


def test_workers_above_max_are_cut_even_in_cooldown() -> None:
    d = Decider(Policy(max_workers=2, cooldown_s=60))  # restarted with a lower max
    assert d.decide(inp(depth=16, current=1), now=0).target == 2  # a change: cooldown starts
    assert d.decide(inp(depth=16, current=4), now=1).target == 2  # 2 too many: cut anyway
