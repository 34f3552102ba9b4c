"""A worker's measured service, for placement (api/placement.py, docs/scheduling.md).

Moving averages over the jobs this worker finished: how long a job takes from its start
here to its end, to its first token, a stream's decode rate after that, and the prompt
rate of the first-token time. The heartbeat carries them (WorkerHeartbeat.pace); the API
reads them to estimate where a new job finishes first. Early jobs weigh more (the mean of
the first ALPHA_N, then an exponential average), so a fresh worker's figure settles fast.
"""

from __future__ import annotations

import threading

from tokenq.shared.schemas import Pace

ALPHA_N = 20  # the first this many jobs: their plain mean; then weight 1/ALPHA_N each


class PaceMeter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self._job_s = self._first_s = self._decode_tps = self._prompt_tps = 0.0

    def observe(self, *, started: float, first_token_at: float | None, ended: float,
                prompt: int, completion: int) -> None:
        """One job (attempt) that ran here from `started` to `ended` and wrote `completion`
        tokens, the first at `first_token_at`."""
        if first_token_at is None or completion < 1 or ended < first_token_at:
            return
        first = max(1e-3, first_token_at - started)
        job = max(first, ended - started)
        decode = (completion - 1) / (ended - first_token_at) if completion > 1 and \
            ended > first_token_at else 0.0
        with self._lock:
            self._n += 1
            a = 1.0 / min(self._n, ALPHA_N)
            self._job_s += a * (job - self._job_s)
            self._first_s += a * (first - self._first_s)
            self._prompt_tps += a * (prompt / first - self._prompt_tps)
            if decode > 0:  # a one-token job says nothing of the decode rate
                self._decode_tps += (a if self._decode_tps else 1.0) * (
                    decode - self._decode_tps)

    def snapshot(self) -> Pace | None:
        with self._lock:
            if not self._n:
                return None
            return Pace(jobs=self._n, job_s=self._job_s, first_token_s=self._first_s,
                        decode_tps=self._decode_tps, prompt_tps=self._prompt_tps)
