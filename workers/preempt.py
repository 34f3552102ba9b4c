"""Preemption: a job waiting in a higher lane does not wait for a batch job's slot.

Celery gives a worker a new message only when one of its slot threads is free, and takes
its lanes high first; with every slot running low-priority jobs, an interactive one would
wait for the first of them to end (a 256-token batch line: tens of seconds on a CPU).
The preemptor looks at its model's lanes when a script puts a job on one of them (each
publishes on the lane's name: create, requeue, hand-back, preempt), every `preempt_poll_s`
while jobs wait there or a preemption settles, and otherwise every IDLE_POLL_S. Waiting jobs
that no look can find room for until news comes (the lane's only backlogged tenant is the
one whose jobs run here: fair_victims.lua's 'alone') count as nothing waiting: one tenant's
backlog on full slots is looked at every IDLE_POLL_S, not 20 times a second. While
every slot is taken and jobs wait in a lane above some running job's, it hands that many of the
lowest-lane jobs back, the fewest times preempted first, then the most recently started
(shared/lua/preempt.lua: `queued` again, tokens kept, `preemptions` + 1). Their slot
threads end, take the waiting jobs (lanes are consumed high first), and the preempted
jobs later continue from their tokens exactly like a takeover: the stream has no gap and
no duplicate, and the record's output is the stream.

Bounded: a job is preempted at most `preempt_max` times; after that it keeps its slot to
its end, so a steady stream of interactive jobs cannot starve a tenant's batch. A
preempted attempt bumps the job's attempt number (the fence) but not its count against
max_attempts (shared/lua/acquire.lua). `preempt_max = 0` turns preemption off.

The freed slot is held (`preempt_hold_s`, where the engine can: llama.cpp): the engine
stops the step under way (workers/engines/llamacpp_context.StepAbort: its tokens are
computed again next step), publishes the cancel and starts no step until the waiting job
arrives, so its prompt goes into the very next step rather than behind the rest of a
batch step; the batch's streams sit that step out (workers/engines/budget.py), so it is no
longer than the prompt's own.

Between tenants of one lane (fair share on, `preempt_fair`): when nothing waits in a
higher lane, a running job of the lane also makes room for the lane's next tenant when its
own tenant holds more of the lane's slots per weight or was served far more
(shared/lua/fair_victims.lua). It goes back into its tenant's list rather than first of
its lane, so the freed slot's take goes to the waiting tenant (docs/scheduling.md); that
take is made by the victim's own slot thread (`preempt_take`: workers/tasks.run_job),
not by a message Celery fetches for it.

A llama.cpp worker keeps the preempted job's KV cells in host memory
(workers/engines/llamacpp_ramcache.py) when the waiting job takes its slot: resumed on
the same worker, it gets them back instead of prefilling its prompt and tokens again.

Exactness: a job resumed elsewhere (or once its cells left that cache) prefills its tokens
in one batch, so a greedy continuation may differ in the last float bits from an
uninterrupted run (as a takeover's may). A job
that asks for exact text (`cache_prompt: false`, which also skips prefix reuse) is never
preempted: "batched jobs at temperature 0 equal each alone" holds for it as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import redis
from celery import Celery
from redis.client import PubSub

from tokenq.shared import keys
from tokenq.shared.celery_app import task_message, ticket_message
from tokenq.shared.metrics import WorkerMetrics
from tokenq.shared.settings import Settings
from tokenq.shared.store import JobStore
from tokenq.workers.drain import LET_GO_S  # how long a handed-back job's engine gets to let go
from tokenq.workers.engines.base import Engine
from tokenq.workers.publisher import JobHandle, Publisher

log = logging.getLogger(__name__)

PREEMPT_WRITE_S = 120.0  # how long a stopped victim's preempt write is retried (a failover)

# Lanes, highest first (shared/keys.PRIORITIES); a job may preempt those after its own.
RANK = {p: i for i, p in enumerate(keys.PRIORITIES)}
LANES = keys.PRIORITIES[:-1]  # the lanes whose jobs may preempt: none ranks below the last
# How often the lanes are read when no news came and nothing waited at the last look: a
# push that no script announced (kombu restoring an unacked message) waits at most this.
IDLE_POLL_S = 0.25
# News is looked at once, unless the last look was this recent: a flood of creates costs
# at most 1/NEWS_GAP_S looks a second (each one LLEN per lane), and an arrival waits for
# its look at most this long (with preempt_poll_s here, 50 ms, 5 of 16 interactive arrivals
# beside a batch waited 17-50 ms for theirs).
NEWS_GAP_S = 0.01
# Except news naming a tenant no look was made for within FRESH_S (a create names its
# tenant): that is looked at after at most MIN_GAP_S. Beside one tenant's flood of creates
# a light tenant's job would otherwise wait up to NEWS_GAP_S for the look that frees it a
# slot (fair share): most of its wait (docs/benchmarks.md, fair share, 2026-11-28 evening).
FRESH_S = 0.1
MIN_GAP_S = 0.001
# Fair share: a slot freed for a lane's next tenant (workers/preempt.Preemptor._fair) counts
# as owed until a take uses it, for at most this long (a freed slot's ticket is taken within
# tens of ms), so two workers do not both free one for one waiting job.
FAIR_CLAIM_MS = 1000


def _closed(pubsub: PubSub | None) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except (redis.RedisError, OSError):
            pass


def news_wait(tenants: Iterable[str], looked_for: Mapping[str, float], last_look: float,
              now: float) -> float:
    """Seconds until news naming `tenants` ('' for news naming none) is looked at: the
    rest of NEWS_GAP_S since `last_look`, or of MIN_GAP_S when it names a tenant not
    looked for (`looked_for`: tenant -> when) within FRESH_S."""
    fresh = any(t and now - looked_for.get(t, float("-inf")) >= FRESH_S for t in tenants)
    return last_look + (MIN_GAP_S if fresh else NEWS_GAP_S) - now


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as the preemptor sees it (in the order its attempts started)."""

    job_id: str
    priority: str
    preemptions: int


def pick_victims(running: Sequence[Running], waiting: Mapping[str, int],
                 preempt_max: int) -> list[str]:
    """The jobs to preempt for the jobs `waiting` (per lane): each waiting job, highest
    lane first, takes the lowest-lane job below its own lane, among those preempted fewer
    than `preempt_max` times; of those, the one preempted fewest times so far (the
    preemptions spread over the batch, and a job that just came back is not sent back
    again at once), then the most recently started (the least work lost)."""
    pool = [(RANK.get(j.priority, RANK["normal"]), i, j) for i, j in enumerate(running)
            if j.preemptions < preempt_max]
    pool.sort(key=lambda c: (-c[0], c[2].preemptions, -c[1]))
    victims: list[str] = []
    for lane in keys.PRIORITIES:
        for _ in range(waiting.get(lane, 0)):
            got = next((c for c in pool if c[0] > RANK[lane]), None)
            if got is None:
                break
            pool.remove(got)
            victims.append(got[2].job_id)
    return victims


@dataclass
class Preemptor:
    store: JobStore
    settings: Settings
    celery: Celery
    publisher: Publisher
    engine: Engine
    model: str
    worker_id: str
    metrics: WorkerMetrics | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _saw_waiting: bool = False  # the last look found jobs in a higher lane
    _last_look: float = float("-inf")  # time.monotonic() of the last look
    _looked_for: dict[str, float] = field(default_factory=dict)  # tenant -> its news' look

    @property
    def r(self) -> redis.Redis:
        return self.store.r

    def start(self) -> None:
        if self.settings.worker.preempt_max <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="tokenq-preempt", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # the loop ends within IDLE_POLL_S

    def _run(self) -> None:
        """Wake on the lanes' news (every script that puts a job on a lane publishes on the
        lane's name), at most once per NEWS_GAP_S; else every preempt_poll_s while jobs
        wait or a preemption settles, else every IDLE_POLL_S (a push no script announced:
        kombu restoring a message)."""
        lanes = [keys.queue(self.model, lane) for lane in self._lanes()]
        poll_s = self.settings.worker.preempt_poll_s
        pubsub: PubSub | None = None
        failing = False
        timeout = 0.0
        while not self._stop.is_set():
            try:
                if pubsub is None:
                    pubsub = self.r.pubsub(  # type: ignore[no-untyped-call]
                        ignore_subscribe_messages=True)
                    pubsub.subscribe(*lanes)
                if (msg := pubsub.get_message(timeout=timeout)) is not None:
                    # at most one look per NEWS_GAP_S, however fast jobs arrive (a new
                    # tenant's job: MIN_GAP_S); a burst of arrivals gets one look for all
                    tenants = {str(msg.get("data") or "")}
                    self._stop.wait(news_wait(tenants, self._looked_for, self._last_look,
                                              time.monotonic()))
                    while (msg := pubsub.get_message(timeout=0)) is not None:
                        tenants.add(str(msg.get("data") or ""))
                    self._note(tenants)
                self._last_look = time.monotonic()
                self.poll()
                failing = False
                timeout = poll_s if self._settling() else IDLE_POLL_S
            except redis.RedisError as exc:  # Redis away: nothing to preempt for meanwhile
                if not failing:
                    log.warning("preemption paused (Redis unavailable: %s)", exc)
                failing = True
                _closed(pubsub)
                pubsub = None
                self._stop.wait(poll_s)
            except Exception:
                log.exception("preemption check failed")
                self._stop.wait(poll_s)
        _closed(pubsub)

    def _note(self, tenants: Iterable[str]) -> None:
        """The tenants this look is for (kept FRESH_S: a few entries)."""
        now = time.monotonic()
        for t in tenants:
            if t:
                self._looked_for[t] = now
        if len(self._looked_for) > 64:
            self._looked_for = {t: at for t, at in self._looked_for.items()
                                if now - at < FRESH_S}

    @property
    def _between_tenants(self) -> bool:
        """Preemption between tenants of a lane (fair share on, preempt_fair)."""
        return self.settings.fair_share and self.settings.worker.preempt_fair

    def _lanes(self) -> tuple[str, ...]:
        """The lanes whose waiting jobs may take a slot: the higher ones, and with
        preemption between tenants every lane."""
        return keys.PRIORITIES if self._between_tenants else LANES

    def _settling(self) -> bool:
        """Jobs waited at the last look, or a preempted job's slot is not free yet."""
        return self._saw_waiting or any(h.released and not h.done.is_set()
                                        for h in self.publisher.tracked())

    def poll(self) -> list[str]:
        """Preempt what the waiting jobs need now; the ids preempted."""
        self._saw_waiting = False
        handles = [h for h in self.publisher.tracked() if not h.released and not h.done.is_set()]
        if not handles or len(handles) < self.engine.slots or not self.engine.healthy():
            return []  # a free slot: Celery hands it the waiting job by itself
        lanes = self._lanes()
        pipe = self.r.pipeline(transaction=False)
        for lane in lanes:
            pipe.llen(keys.queue(self.model, lane))
        waiting = dict(zip(lanes, (int(n) for n in pipe.execute()), strict=True))
        self._saw_waiting = any(waiting.get(lane) for lane in LANES)
        if not any(waiting.values()):
            return []
        # Slots of exact jobs count as taken but are never freed for another job.
        pool = [(h, Running(h.job_id, h.priority, h.preemptions)) for h in handles
                if h.preemptable]
        chosen = set(pick_victims([run for _, run in pool], waiting,
                                  self.settings.worker.preempt_max))
        if chosen:
            return self.preempt([(h, run.priority, False) for h, run in pool
                                 if run.job_id in chosen])
        return self._fair(pool, waiting)

    def _fair(self, pool: Sequence[tuple[JobHandle, Running]],
              waiting: Mapping[str, int]) -> list[str]:
        """Preemption between tenants: for the highest lane with jobs waiting, the running
        job here (below preempt_max) that fair_victims.lua picks to make room for the
        lane's next tenant: one of a tenant holding more of the lane's slots per weight
        (counted over every worker) and served no less, or served far more."""
        lane = next((lane for lane in keys.PRIORITIES if waiting.get(lane)), None)
        if lane is None or not self._between_tenants:
            return []
        mine = [(h, run) for h, run in pool if run.priority == lane
                and run.preemptions < self.settings.worker.preempt_max]
        # the fewest times preempted first (a resumed job is its tenant's newest here: sent
        # back at each look, it would reach preempt_max and then hold its slot against
        # every waiting tenant), then the most recently started (the least work lost)
        mine.reverse()
        mine.sort(key=lambda c: c[1].preemptions)
        status, chosen = self.store.fair_victims(keys.queue(self.model, lane),
                                                 [run.job_id for _, run in mine], FAIR_CLAIM_MS)
        if status == "claimed":
            self._saw_waiting = True  # a slot is on its way: look again soon
        elif status == "alone":
            self._saw_waiting = False  # nothing to free until news (a new tenant) comes
        return self.preempt([(h, lane, True) for h, run in mine if run.job_id == chosen])

    def _write(self, handle: JobHandle, queue: str, messages: tuple[str, str]) -> bool:
        """preempt.lua for a stopped victim, tried again while Redis is away (a failover):
        the attempt is already stopped, and one not recorded as preempted would be taken
        over as a lost attempt, counted against max_attempts. The script still finds the
        job ours once Redis is back, lease expired or not, unless a newer attempt took it."""
        delay, deadline = 0.1, time.monotonic() + PREEMPT_WRITE_S
        message, ticket = messages
        while True:
            try:
                return self.store.preempt(handle.job_id, self.worker_id, handle.attempt, queue,
                                          message, ticket)
            except redis.RedisError as exc:
                if time.monotonic() + delay > deadline or self._stop.is_set():
                    raise
                log.warning("job %s: preemption not written (%s); retrying", handle.job_id, exc)
                self._stop.wait(delay)
                delay = min(2.0, delay * 2)

    def preempt(self, victims: Sequence[tuple[JobHandle, str, bool]]) -> list[str]:
        """Stop the engine on each victim (what it generated after its last written step is
        dropped: the next attempt generates it again), then put it back on its queue
        (`fair`: into its tenant's list, behind the lane's ticket)."""
        hold = getattr(self.engine, "hold", None)
        take = self.settings.worker.preempt_take
        for handle, priority, fair in victims:
            handle.released = True  # the heartbeat stops renewing its lease
            if fair and take:  # its thread takes the lane's next job (workers/tasks.py)
                handle.take_next = priority
            handle.outcome = "preempted"  # what its task thread returns
            self.publisher.drop(handle.job_id, handle.attempt)
            self.engine.cancel(handle.job_id)
            if hold is not None and self.settings.worker.preempt_hold_s > 0:
                hold(self.settings.worker.preempt_hold_s)  # the waiting job joins next step
        # the messages that put each back (fair: into its tenant's list, and a ticket),
        # built while the engine lets go
        queues = [keys.queue(self.model, priority) for _, priority, _ in victims]
        messages = [(task_message(self.celery, handle.job_id, queue),
                     ticket_message(self.celery, queue) if fair else "")
                    for (handle, _, fair), queue in zip(victims, queues, strict=True)]
        done: list[str] = []
        for (handle, _, fair), queue, msgs in zip(victims, queues, messages, strict=True):
            if self.engine.healthy():
                handle.done.wait(LET_GO_S)  # its steps before the cancel are written
            ok = self._write(handle, queue, msgs)
            log.info("job %s: preempted for a waiting %s job (%s)", handle.job_id,
                     "less-served tenant's" if fair else "higher-priority",
                     "requeued" if ok else "no longer ours")
            if ok:
                done.append(handle.job_id)
                if self.metrics is not None:
                    self.metrics.preemptions.labels(self.model).inc()
        return done
