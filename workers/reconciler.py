"""The rescue: any worker re-enqueues jobs no message will deliver, and forgets the dead.

Two kinds of job are stuck without it: running ones whose lease expired (their worker
died) and queued ones whose message a dying worker popped before kombu recorded it as
delivered (shared/lua/requeue.lua). The script checks and pushes atomically, so however
many workers reconcile at once, a job is re-enqueued at most once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import redis
from celery import Celery

from tokenq.shared import keys
from tokenq.shared.celery_app import task_message, ticket_message
from tokenq.shared.schemas import live_workers
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore

log = logging.getLogger(__name__)

# Lost messages are rare, and a popped one is at the consuming end: each pass looks at
# this many of the oldest queued jobs.
RESCUE_BATCH = 100


@dataclass
class Reconciler:
    store: JobStore
    settings: Settings
    celery: Celery
    _next_run: float = field(default_factory=time.monotonic)  # reconcile on the first beat
    _next_rescue: float = 0.0

    @property
    def r(self) -> redis.Redis:
        return self.store.r

    def maybe_run(self) -> None:
        """Reconcile when reconcile_s has passed since the last pass (heartbeat thread)."""
        if time.monotonic() >= self._next_run:
            self.reconcile()
            self._next_run = time.monotonic() + self.settings.worker.reconcile_s

    def reconcile(self) -> int:
        """Re-enqueue the jobs no message will deliver; how many were."""
        running: list[str] = self.r.zrange(keys.RUNNING, 0, -1)  # type: ignore[assignment]
        pipe = self.r.pipeline(transaction=False)
        for job_key in running:
            pipe.exists(keys.job_lease(keys.job_id_of(job_key)))
        stale = [k for k, alive in zip(running, pipe.execute(), strict=True) if not alive]
        # Lost messages: every rescue_after_s / 2, not every pass.
        now = time.time()
        if now >= self._next_rescue:
            self._next_rescue = now + self.settings.worker.rescue_after_s / 2
            oldest: list[str] = self.r.zrangebyscore(  # type: ignore[assignment]
                keys.QUEUED, 0, now - self.settings.worker.rescue_after_s, start=0,
                num=RESCUE_BATCH)
            stale += oldest
            self.forget_dead_workers(now)
        return sum(self._rescue(job_key) for job_key in stale)

    def _rescue(self, job_key: str) -> bool:
        job_id = keys.job_id_of(job_key)
        rec: list[str | None] = self.r.hmget(  # type: ignore[assignment]
            job_key, ["model", "priority", "state", "pool"])
        if not rec[0]:
            self.r.zrem(keys.RUNNING, job_key)
            self.r.zrem(keys.QUEUED, job_key)
            return False
        queue = keys.queue(rec[3] or rec[0], rec[1] or "normal")  # its pool's (placement)
        if not self.store.requeue(job_id, queue, task_message(self.celery, job_id, queue),
                                  ticket_message(self.celery, queue)):
            return False
        log.warning("job %s (%s): no worker holds it and no message will deliver it; "
                    "re-enqueued", job_id, rec[2])
        return True

    def forget_dead_workers(self, now: float) -> None:
        """Drop heartbeats of workers silent for 3 x worker_ttl_s (SIGKILLed: they never
        said goodbye), so /metrics, /v1/admin/workers and slot counts stop showing them.
        A worker that was only paused writes its heartbeat back on its next beat."""
        beats: dict[str, str] = self.r.hgetall(keys.WORKERS)  # type: ignore[assignment]
        alive = live_workers(beats, 3 * self.settings.worker_ttl_s, now)
        dead = [w for w in beats if w not in alive]
        if dead:
            self.r.hdel(keys.WORKERS, *dead)
