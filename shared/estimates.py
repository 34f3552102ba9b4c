"""A pool's pace and a job's own time at it: what placement (api/placement.py) and the
moves between pools (workers/rebalance.py) estimate by. Pure functions of the workers'
heartbeats (their measured pace: workers/pace.py)."""

from __future__ import annotations

from tokenq.shared.schemas import Pace, WorkerHeartbeat

# The pace of a pool nobody has measured, where no pool has been: all pools alike.
PRIOR = Pace(jobs=0, job_s=1.0, first_token_s=0.05, decode_tps=20.0, prompt_tps=1000.0)


def combined_pace(beats: list[WorkerHeartbeat]) -> Pace | None:
    """The workers' paces, weighted by the jobs each measured."""
    paces = [b.pace for b in beats if b.pace is not None and b.pace.jobs > 0]
    return mean_pace(paces)


def mean_pace(paces: list[Pace]) -> Pace | None:
    if not paces:
        return None
    n = sum(p.jobs for p in paces)
    w = [(p.jobs or 1) / (n or len(paces)) for p in paces]

    def avg(field: str) -> float:
        return float(sum(x * getattr(p, field) for x, p in zip(w, paces, strict=True)))

    return Pace(jobs=n, job_s=avg("job_s"), first_token_s=avg("first_token_s"),
                decode_tps=avg("decode_tps"), prompt_tps=avg("prompt_tps"))


def own_times(pace: Pace, n_prompt: int, max_tokens: int) -> tuple[float, float]:
    """The job's own first-token and decode seconds at `pace`."""
    first = n_prompt / pace.prompt_tps if pace.prompt_tps > 0 else pace.first_token_s
    decode = (max(1, max_tokens) - 1) / pace.decode_tps if pace.decode_tps > 0 else 0.0
    return first, decode
