"""Preemption's calls (shared/lua/preempt.lua, fair_victims.lua): a running job back to
`queued` with its tokens kept, and which of a worker's jobs makes room for a tenant served
far less. Beside shared/jobs.py, the rest of the job protocol; the stores run them."""

from __future__ import annotations

from collections.abc import Sequence

from tokenq.shared import keys
from tokenq.shared.jobs import Call, FairShare, lease_value, text


def preempt(job_id: str, *, worker: str, attempt: int, queue: str, message: str, now: float,
            maxlen: int, ticket: str = "", fair: FairShare | None = None) -> Call[bool]:
    """`ticket` (fair share): back into its tenant's list behind the lane's ticket rather
    than first of its lane (preempt.lua)."""
    return Call("preempt", [keys.job(job_id), keys.job_lease(job_id), queue,
                            keys.job_events(job_id), keys.RUNNING, keys.QUEUED],
                [lease_value(worker, attempt), message, repr(now), maxlen, attempt, ticket,
                 *(fair or FairShare()).args()], bool)


def fair_victims(queue: str, running: Sequence[str], *, claim_ms: int, now: float,
                 fair: FairShare) -> Call[tuple[str, str | None]]:
    """Of `running` (this worker's jobs of the lane, in the order to choose from), the one
    to hand back to the tenant the lane's next ticket takes: ('ok', id), ('claimed', None),
    ('none', None), or ('alone', None) when no later look can find one either until news
    comes: the lane's only backlogged tenant is the one running here (fair_victims.lua)."""
    lane = keys.lane(queue)
    return Call("fair_victims", [keys.lane_tenants(lane), keys.lane_ceded(lane),
                                 keys.lane_held(lane)],
                [claim_ms, repr(now), repr(fair.half_s), *running],
                lambda got: (text(got[0]), text(got[1]) if len(got) > 1 else None))
