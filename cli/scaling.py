"""The autoscaler's decision, as pure logic: observations in, a worker count out.

desired = clamp(ceil((queue depth + running jobs) / slots per worker) - external, min, max)

then stabilised the way Kubernetes' HPA does it (behavior.scaleUp/scaleDown
stabilizationWindowSeconds): scale up to the *lowest* recommendation of the
up-window, down to the *highest* of the down-window. A burst is served at once
(up-window 0 by default) while a queue that empties for a moment does not stop
workers that the next second needs. On top, a cooldown: no scale-down within
`cooldown_s` of the last change, so a worker that just started (and loaded its
model) is not drained by the lull right after the burst it was started for.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Policy:
    min_workers: int = 0
    max_workers: int = 4
    up_window_s: float = 0.0
    down_window_s: float = 30.0
    cooldown_s: float = 30.0
    # Jobs one worker should hold; None: its engine slots (n_parallel / max_num_seqs).
    target_per_worker: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(f"need 0 <= min ({self.min_workers}) <= max ({self.max_workers})")
        if self.target_per_worker is not None and self.target_per_worker < 1:
            raise ValueError("target_per_worker must be >= 1")


@dataclass(frozen=True)
class Inputs:
    """What the autoscaler read for one model at one tick."""

    depth: int  # messages in the model's queues, all priorities
    running: int  # jobs in engines (live heartbeats), managed and external workers alike
    free_slots: int  # engine slots free on live workers (logged: how much headroom is left)
    slots_per_worker: int
    current: int  # workers this autoscaler runs (starting ones included, draining ones not)
    external: int = 0  # live workers for the model that someone else runs (a fixed pool)


@dataclass(frozen=True)
class Decision:
    target: int
    raw: int  # the clamped recommendation before stabilisation and cooldown
    reason: str

    @property
    def changes(self) -> bool:
        return self.reason in ("scale_up", "scale_down")


def recommend(inp: Inputs, policy: Policy) -> int:
    """clamp(ceil((depth + running) / per_worker) - external, min, max)."""
    per_worker = policy.target_per_worker or max(1, inp.slots_per_worker)
    need = math.ceil((inp.depth + inp.running) / per_worker) - inp.external
    return max(policy.min_workers, min(policy.max_workers, need))


@dataclass
class Decider:
    """One model's stabilisation state: recent recommendations and the last change."""

    policy: Policy
    _history: deque[tuple[float, int]] = field(default_factory=deque)
    _last_change: float | None = None

    def decide(self, inp: Inputs, now: float) -> Decision:
        p = self.policy
        raw = recommend(inp, p)
        self._history.append((now, raw))
        horizon = now - max(p.up_window_s, p.down_window_s)
        while self._history and self._history[0][0] < horizon:
            self._history.popleft()
        up = min(r for t, r in self._history if t >= now - p.up_window_s)
        down = max(r for t, r in self._history if t >= now - p.down_window_s)
        target = inp.current
        if target < up:
            target = up
        if target > down:
            target = down
        # Outside [min, max] (the policy changed under running workers): correct at once.
        target = max(p.min_workers, min(p.max_workers, target))
        if target > inp.current:
            return self._change(target, raw, now, "scale_up")
        if target < inp.current:
            in_range = inp.current <= p.max_workers
            if in_range and self._last_change is not None and \
                    now - self._last_change < p.cooldown_s:
                return Decision(inp.current, raw, "cooldown")
            return self._change(target, raw, now, "scale_down")
        reason = "stable" if raw == inp.current else "stabilising"
        return Decision(inp.current, raw, reason)

    def _change(self, target: int, raw: int, now: float, reason: str) -> Decision:
        self._last_change = now
        return Decision(target, raw, reason)
