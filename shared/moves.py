"""Moving a queued job between a model's pools (shared/lua/move.lua): the call and its
answer. Beside shared/jobs.py, the rest of the job protocol; the stores run it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tokenq.shared import keys
from tokenq.shared.jobs import Call, FairShare


class Moved(enum.StrEnum):
    OK = "ok"
    CHANGED = "changed"  # the from-lane's next job is another one now
    PINNED = "pinned"  # pinned to its pool, or a message names it: never moved
    STALE = "stale"  # not queued any more (the next take skips it)
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class MoveResult:
    status: Moved
    job_id: str | None = None


def _moved(got: list[Any]) -> MoveResult:
    return MoveResult(Moved(str(got[0])), str(got[1]) if len(got) > 1 else None)


def move(expected: str, *, from_queue: str, to_queue: str, from_pool: str, to_pool: str,
         to_backend: str, ticket: str, now: float, fair: FairShare) -> Call[MoveResult]:
    """The `from_queue` lane's next job, if it is still `expected`, into `to_queue`'s lane
    (the same model and priority, another pool, served by `to_backend`); `ticket` is
    `to_queue`'s."""
    from_lane, to_lane = keys.lane(from_queue), keys.lane(to_queue)
    return Call("move", [keys.lane_tenants(from_lane), keys.lane_tenants(to_lane),
                         keys.POOL_LOAD, from_queue, to_queue],
                [from_lane, to_lane, from_pool, to_pool, expected, ticket, repr(now),
                 *fair.args(), to_backend], _moved)
