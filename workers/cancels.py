"""Cancels of the jobs this worker runs, watched on one thread for the whole process.

`DELETE /v1/jobs/{id}` marks the job's record `cancel_requested`. A job that writes tokens
learns of it at its next write (the append script answers CANCEL_REQUESTED: see
workers/publisher.py); one that writes nothing yet (waiting for a slot inside the engine, or
in a long prefill) learns of it here. Every `poll_s` this thread reads the flag of every
job in flight in one pipelined round trip and tells the engine of each new cancel once.
(Each task thread used to poll its own job: 4 round trips a second per slot, 256 for a
64-slot GPU worker, against 4 here.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from tokenq.shared import keys

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25


class CancelWatcher:
    def __init__(self, r: redis.Redis, cancel: Callable[[str], None],
                 poll_s: float = CANCEL_POLL_S):
        """`r`: a client that decodes replies (the worker's); `cancel(job_id)`: the engine's
        cancel (never called twice for one watch)."""
        self._r = r
        self._cancel = cancel
        self._poll_s = poll_s
        self._lock = threading.Lock()
        # job id -> (attempt, its cancel was passed on)
        self._watched: dict[str, tuple[int, bool]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, job_id: str, attempt: int) -> None:
        """From when the engine has the job (a cancel before that would reach nothing)."""
        with self._lock:
            self._watched[job_id] = (attempt, False)

    def unwatch(self, job_id: str, attempt: int) -> None:
        """A preempted attempt's thread may end after the job's next attempt started here:
        only its own watch goes."""
        with self._lock:
            if self._watched.get(job_id, (None, False))[0] == attempt:
                del self._watched[job_id]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tokenq-cancels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.check()
            except Exception:  # never let the watcher die: cancels would stop
                log.exception("cancel watcher: check failed")

    def check(self) -> list[str]:
        """One look at every watched job; the ones whose cancel was passed on now. A Redis
        outage passes nothing on (the engine goes on; the next look after it tells)."""
        with self._lock:
            jobs = [j for j, (_, sent) in self._watched.items() if not sent]
        if not jobs:
            return []
        pipe = self._r.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hget(keys.job(job_id), "cancel_requested")
        try:
            flags = pipe.execute()
        except redis.RedisError:
            return []
        found: list[str] = []
        with self._lock:
            for job_id, flag in zip(jobs, flags, strict=True):
                watched = self._watched.get(job_id)
                if flag == "1" and watched is not None and not watched[1]:
                    self._watched[job_id] = (watched[0], True)
                    found.append(job_id)
        for job_id in found:
            self._cancel(job_id)
        return found
