"""A worker's job leases: renewed on every heartbeat; a lease lost aborts its attempt.

A lease is `tokenq:job:{id}:lease` = "{worker}|{attempt}" with a TTL of lease_ttl_s.
While it lives no other worker runs the job; once it expired and a takeover's acquire
bumped the attempt, every write of the old attempt is fenced off, so this worker stops
its engine on the job (outcome `fenced`) instead of generating for nobody.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Engine
from tokenq.workers.publisher import Publisher

log = logging.getLogger(__name__)


@dataclass
class Leases:
    store: JobStore
    publisher: Publisher
    engine: Engine
    worker_id: str

    def renew(self) -> None:
        """Renew every running job's lease in one round trip (handed-back jobs excepted)."""
        handles = [h for h in self.publisher.tracked() if not h.released]
        held = self.store.renew([(h.job_id, h.attempt) for h in handles], self.worker_id)
        for h, ok in zip(handles, held, strict=True):
            if not ok and not h.done.is_set():
                log.warning("job %s: lease lost; aborting attempt %d", h.job_id, h.attempt)
                h.outcome = "fenced"
                h.nudge.set()  # its task thread stops waiting for the job (workers/tasks.py)
                # The engine cancels by job: not when this worker took the job again
                # meanwhile (that newer attempt is what the engine runs now).
                if self.publisher.current(h.job_id) is h:
                    self.engine.cancel(h.job_id)
