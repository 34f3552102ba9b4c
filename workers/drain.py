"""Giving jobs back: on SIGTERM (drain) and when the engine dies under a running job.

A handed-back job goes back on its queue with its lease dropped, and the next worker
continues it from the tokens already streamed (the same path as a takeover), so a
rolling restart or a crashed engine costs clients a pause, not their job.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from celery import Celery

from tokenq.shared import keys
from tokenq.shared.celery_app import task_message
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Engine
from tokenq.workers.publisher import Publisher

log = logging.getLogger(__name__)

# How long a handed-back job's engine gets to let go (its last token steps written).
LET_GO_S = 5.0


@dataclass
class Drainer:
    store: JobStore
    settings: Settings
    celery: Celery
    publisher: Publisher
    engine: Engine
    model: str
    worker_id: str
    draining: bool = False  # a slot thread takes no job of its own then (workers/tasks.py)

    def drain(self) -> None:
        """SIGTERM: Celery stops consuming at once; running jobs get `drain_grace_s` to
        finish, then are handed back and continued by another worker from their tokens."""
        self.draining = True

        def hand_back_later() -> None:
            deadline = time.monotonic() + self.settings.worker.drain_grace_s
            while self.publisher.tracked() and time.monotonic() < deadline:
                time.sleep(0.1)
            for h in self.publisher.tracked():
                self.hand_back(h.job_id, h.attempt)

        threading.Thread(target=hand_back_later, name="tokenq-drain", daemon=True).start()

    def hand_back(self, job_id: str, attempt: int) -> None:
        handle = next((h for h in self.publisher.tracked() if h.job_id == job_id), None)
        if handle is None:
            return
        handle.released = True  # the heartbeat stops renewing its lease
        self.publisher.drop(job_id, attempt)  # nothing more is written for this attempt
        self.engine.cancel(job_id)
        if self.engine.healthy():  # a dead engine writes nothing more
            handle.done.wait(LET_GO_S)  # every token step before the cancel has been written
        rec: list[str | None] = self.store.r.hmget(  # type: ignore[assignment]
            keys.job(job_id), ["pool", "model", "priority"])
        queue = keys.queue(rec[0] or rec[1] or self.model, rec[2] or "normal")
        ok = self.store.hand_back(job_id, self.worker_id, attempt, queue,
                                  task_message(self.celery, job_id, queue))
        log.warning("job %s: handed back (%s)", job_id, "requeued" if ok else "not ours")
