"""A waiting job's position and eta (docs/scheduling.md, "Position and ETA"): computed in
Redis from its lane's structures by shared/lua/eta.lua, at enqueue (create.lua: the
`queued` event and the 202) and on demand (position.lua: GET /v1/jobs/{id}, the SSE
stream's `queued` updates)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from tokenq.shared import keys
from tokenq.shared.jobs import FairShare
from tokenq.shared.lua_scripts import source

UPDATE_EVERY_S = 1.0  # an SSE stream re-sends `queued` at most this often


@dataclass(frozen=True, slots=True)
class Estimate:
    position: int  # jobs that would be taken before it
    eta_s: float | None  # seconds until it starts (None: the pool's pace is not known yet)
    reason: str = "waiting"

    def data(self) -> dict[str, Any]:
        """A `queued` event's data, as create.lua writes it."""
        d: dict[str, Any] = {"position": self.position, "reason": self.reason}
        if self.eta_s is not None:
            d["eta_s"] = self.eta_s
        return d

    def moved(self, last: Estimate | None) -> bool:
        """Changed by more than a step since `last` was sent: the position by a tenth of
        it (at least 1), or the eta by a tenth of it (at least 1 s), or known or not; or
        the reason it waits."""
        if last is None or self.reason != last.reason:
            return True
        if abs(self.position - last.position) >= max(1, math.ceil(last.position / 10)):
            return True
        if (self.eta_s is None) != (last.eta_s is None):
            return True
        if self.eta_s is None or last.eta_s is None:
            return False
        return abs(self.eta_s - last.eta_s) >= max(1.0, last.eta_s / 10)


def from_ms(position: Any, eta_ms: Any) -> Estimate:
    ms = int(eta_ms)
    return Estimate(int(position), None if ms < 0 else ms / 1000)


def of_event(data: dict[str, Any]) -> Estimate | None:
    """A `queued` event's estimate (None: one without a position, e.g. a preempted job's)."""
    pos, eta = data.get("position"), data.get("eta_s")
    if not isinstance(pos, int):
        return None
    return Estimate(pos, float(eta) if isinstance(eta, int | float) else None,
                    str(data.get("reason", "waiting")))


async def estimate(r: Any, job_id: str, fair: FairShare,
                   now: float | None = None) -> Estimate | None:
    """The job's estimate now (r: an asyncio client); None when it is not queued."""
    script = r.register_script(source("position"))
    got = await script(keys=[keys.job(job_id)],
                       args=[repr(time.time() if now is None else now), *fair.args()])
    return from_ms(got[0], got[1]) if got else None


def estimate_sync(r: Any, job_id: str, fair: FairShare,
                  now: float | None = None) -> Estimate | None:
    """`estimate` on a sync client (tests, the benchmark)."""
    got = r.register_script(source("position"))(
        keys=[keys.job(job_id)], args=[repr(time.time() if now is None else now), *fair.args()])
    return from_ms(got[0], got[1]) if got else None
