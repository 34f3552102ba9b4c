"""Moving queued jobs between a model's pools (docs/scheduling.md, "Moving queued jobs").

Placement (api/placement.py) chooses a job's pool once, at submit, by estimates that can go
stale: a pool's workers die or stall, or run slower than measured, and the jobs waiting in
its lanes wait for it while another pool of the same model sits idle. So a worker with a
free slot and nothing waiting in its own lanes looks at the model's other pools every
`worker.move_every_s`, highest priority first. For each lane with jobs waiting it takes
the job that lane's next ticket would take (fair share's choice, shared/lua/move.lua) into
its own lane, with a ticket, when it finishes that job sooner than the other pool would:

    there  = a slot of that pool frees (its mean job time / (its slots + 1)), plus the
             job's own first-token and decode time at its pace; never, while no live
             worker serves it
    here   = the job's own time at this pool's pace (a slot is free now)
    move when here < MARGIN x there, and that pool has no free slot (load > slots)

It moves as many jobs as it has free slots, one atomic step each, and only the job it
estimated (another worker may move or take it first). Running jobs never move, nor jobs
pinned to their pool (`backend`), nor jobs a message names (a hand-back, a takeover).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import redis
from celery import Celery

from tokenq.shared import keys
from tokenq.shared.celery_app import ticket_message
from tokenq.shared.estimates import PRIOR, combined_pace, mean_pace, own_times
from tokenq.shared.moves import Moved
from tokenq.shared.schemas import Pace, live_workers
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Engine
from tokenq.workers.publisher import Publisher

log = logging.getLogger(__name__)

# A move must gain this much (here < MARGIN x there): a job estimated about as soon on
# either pool stays where placement put it.
MARGIN = 0.9


@dataclass(frozen=True, slots=True)
class Head:
    """The job a lane's next ticket would take, as the move estimates it."""

    job_id: str
    n_prompt: int
    max_tokens: int


def worth_moving(head: Head, here: Pace, there: Pace | None, slots_there: int,
                 load_there: int) -> tuple[bool, float, float]:
    """(move?, seconds to finish here, seconds there) by the module's rule; `there` None:
    no live worker serves that pool (it would wait for one)."""
    mine = sum(own_times(here, head.n_prompt, head.max_tokens))
    if there is None or slots_there <= 0:
        return True, mine, float("inf")
    theirs = (there.job_s / (slots_there + 1)
              + sum(own_times(there, head.n_prompt, head.max_tokens)))
    return load_there > slots_there and mine < MARGIN * theirs, mine, theirs


@dataclass
class Rebalancer:
    store: JobStore
    settings: Settings
    celery: Celery
    publisher: Publisher
    engine: Engine
    pool: str  # this worker's pool id (its queues' name)
    pools: list[str]  # every pool id of the model, this one included
    backend: str  # this pool's (a moved job's record says where it runs)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    moved: int = 0

    @property
    def r(self) -> redis.Redis:
        return self.store.r

    @property
    def others(self) -> list[str]:
        return [p for p in self.pools if p != self.pool]

    def start(self) -> None:
        if not self.others or not self.settings.worker.move_queued:
            return
        self._thread = threading.Thread(target=self._run, name="tokenq-rebalance",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.worker.move_every_s):
            try:
                self.poll()
            except redis.RedisError as exc:  # Redis away: the next look tries again
                log.debug("rebalance: %s", exc)

    def free_slots(self) -> int:
        if not self.engine.healthy():
            return 0
        busy = [h for h in self.publisher.tracked() if not h.released and not h.done.is_set()]
        return self.engine.slots - len(busy)

    def poll(self) -> list[str]:
        """Take what this worker's free slots finish sooner than the other pools would;
        the ids moved here."""
        free = self.free_slots()
        if free <= 0:
            return []
        pipe = self.r.pipeline(transaction=False)
        for pool in self.pools:
            for prio in keys.PRIORITIES:
                pipe.llen(keys.queue(pool, prio))
        pipe.hgetall(keys.WORKERS)
        pipe.hgetall(keys.POOL_LOAD)
        *lens, raw_beats, raw_load = pipe.execute()
        waiting = dict(zip([(p, q) for p in self.pools for q in keys.PRIORITIES], lens,
                           strict=True))
        if any(waiting[(self.pool, q)] for q in keys.PRIORITIES):
            return []  # this pool's own jobs first: its tickets take them
        beats = list(live_workers(raw_beats, self.settings.worker_ttl_s).values())
        paces = {p: combined_pace([b for b in beats if b.pool == p]) for p in self.pools}
        known = mean_pace([x for x in paces.values() if x is not None]) or PRIOR
        slots = {p: sum(b.slots for b in beats if b.pool == p) for p in self.pools}
        load = {p: int(raw_load.get(p, 0) or 0) for p in self.pools}
        moved: list[str] = []
        for prio in keys.PRIORITIES:
            for other in self.others:
                for _ in range(int(waiting[(other, prio)])):
                    if free <= 0:
                        return moved
                    head = self._head(keys.queue(other, prio))
                    if head is None:
                        break
                    there = (paces[other] or known) if slots[other] else None
                    ok, here_s, there_s = worth_moving(head, paces[self.pool] or known, there,
                                                       slots[other], load[other])
                    if not ok:
                        break
                    if not self._move(head, other, prio, here_s, there_s):
                        break
                    moved.append(head.job_id)
                    free -= 1
                    load[other] -= 1
        return moved

    def _head(self, queue: str) -> Head | None:
        lane = keys.lane(queue)
        tenant: list[str] = self.r.zrange(keys.lane_tenants(lane), 0, 0)  # type: ignore[assignment]
        if not tenant:
            return None
        job_id: str | None = self.r.lindex(  # type: ignore[assignment]
            keys.lane_list(lane, tenant[0]), 0)
        if job_id is None:
            return None
        rec: list[str | None] = self.r.hmget(  # type: ignore[assignment]
            keys.job(job_id), ["prompt_tokens", "est_tokens"])
        n_prompt = int(rec[0] or 0)
        return Head(job_id, n_prompt, max(1, int(rec[1] or 0) - n_prompt))

    def _move(self, head: Head, other: str, prio: str, here_s: float, there_s: float) -> bool:
        mine = keys.queue(self.pool, prio)
        got = self.store.move(head.job_id, from_queue=keys.queue(other, prio), to_queue=mine,
                              from_pool=other, to_pool=self.pool, to_backend=self.backend,
                              ticket=ticket_message(self.celery, mine))
        if got.status is not Moved.OK:
            return False
        self.moved += 1
        log.info("job %s: moved from pool %s to %s (finish estimated %.2f s here, %s there)",
                 head.job_id, other, self.pool, here_s,
                 "no live worker" if there_s == float("inf") else f"{there_s:.2f} s")
        return True

