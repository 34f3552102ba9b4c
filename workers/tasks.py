"""The generate task: take the job, submit it to the engine, wait for its end.

A message is a ticket of its lane (the job is chosen here, fair share: store.pick) or
names its job (a takeover, a preempted job, a hand-back: store.acquire).

Celery runs this on a threads pool with concurrency = engine slots, so one worker
process keeps that many jobs in flight against its one engine. The task thread does no
per-token work: the engine emits steps, the publisher writes them (and ends the job),
and this thread only watches for a lost lease or a dead engine until then (the worker's
cancel watcher, workers/cancels.py, passes a cancel on).
The runtime it runs on (workers/runtime.py) is bound to the Celery app at worker start.
"""

from __future__ import annotations

import json
import logging
import time

import redis
from celery import Task
from celery.exceptions import Reject

from tokenq.shared import keys, logs, tracing
from tokenq.shared.jobs import Acquired, AcquireResult, Ending, NoJob, dumps
from tokenq.shared.schemas import EVENT_CANCELLED, SamplingParams
from tokenq.workers.engines.base import EngineRequest
from tokenq.workers.publisher import JobHandle
from tokenq.workers.runtime import WorkerRuntime, runtime_of

log = logging.getLogger(__name__)

# A waiting task thread is woken by its handle's nudge; it looks on its own only this often,
# a safety net (it used to poll every 0.25 s: 4 wake-ups a second per slot).
WATCHDOG_S = 5.0
FIRST_TOKEN_LOOK = 16  # stream entries read to find the first token (events before it: few)
FENCED_LET_GO_S = 5.0  # a fenced attempt's engine gets this long to let go of the job


def generate(task: Task, job_id: str, lane: str = "") -> str:
    """Celery task `tokenq.generate` (bound): run one job on this process's engine. A
    ticket (no job id) takes its lane's next job; its lane is the message's routing key."""
    rt = runtime_of(task.app)
    if rt is None:
        raise RuntimeError("worker runtime is not started")
    if not job_id:
        info = task.request.delivery_info or {}
        return run_ticket(rt, lane or str(info.get("routing_key") or ""))
    return run_job(rt, job_id)


def run_ticket(rt: WorkerRuntime, lane: str) -> str:
    """A ticket: the lane's next job (fair share, one atomic step), then as run_job. A
    ticket that finds no job (cancelled, or taken by an earlier ticket) is acked."""
    _engine_alive(rt)
    acquire_start = time.time()
    picked = rt.store.pick(lane, rt.worker_id)
    if isinstance(picked, NoJob):
        log.debug("ticket of %s: no job (%s)", lane, picked.reason)
        return picked.reason
    return run_job(rt, picked.job_id, (picked.result, acquire_start, time.time()))


def _engine_alive(rt: WorkerRuntime) -> None:
    if rt.engine_dead.is_set() or not rt.engine.healthy():
        # This worker is on its way out; leave the message for a live one.
        time.sleep(0.5)
        raise Reject("the worker's engine is dead", requeue=True)


def run_job(rt: WorkerRuntime, job_id: str,
            taken: tuple[AcquireResult, float, float] | None = None) -> str:
    """acquire -> submit -> wait -> end; the outcome (or why the job was not run). Every
    log line of the job carries its id, tenant, model and worker (JSON logs).
    A job preempted for a tenant of its lane is followed in this thread by the lane's next
    job (`preempt_take`): the thread takes the ticket at the queue's end itself, as if
    Celery had delivered it, and the waiting job skips Celery's hand-off (ack, fetch,
    dispatch). Bounded in time: Celery restores a message unacked for visibility_timeout_s."""
    began = time.monotonic()
    outcome, then = _run_bound(rt, job_id, taken)
    while then and time.monotonic() - began < rt.settings.visibility_timeout_s / 4:
        got = take_direct(rt, then, job_id)
        if got is None:
            break
        job_id, taken = got
        outcome, then = _run_bound(rt, job_id, taken)
    return outcome


def take_direct(rt: WorkerRuntime, lane: str,
                left: str) -> tuple[str, tuple[AcquireResult, float, float]] | None:
    """The next job of the pool's `lane` into the slot job `left` gave up (NoJob: leave it
    to Celery, as while a higher lane has work; a worker draining or with a dead engine
    takes none)."""
    if rt.drainer.draining or rt.engine_dead.is_set() or not rt.engine.healthy():
        return None
    higher = keys.PRIORITIES[:keys.PRIORITIES.index(lane)]
    start = time.time()
    try:
        picked = rt.store.pick(keys.queue(rt.pool, lane), rt.worker_id, direct=True,
                               above=[keys.queue(rt.pool, p) for p in higher])
    except redis.RedisError:
        return None
    if isinstance(picked, NoJob):
        return None
    log.info("job %s: taken into the slot job %s left", picked.job_id, left)
    return picked.job_id, (picked.result, start, time.time())


def _run_bound(rt: WorkerRuntime, job_id: str,
               taken: tuple[AcquireResult, float, float] | None) -> tuple[str, str]:
    """The job's run with its context on every log line; its outcome, and the lane whose
    next job this thread takes now (preempted for it), if any."""
    tenant: str | None = None
    if logs.json_wanted():
        try:
            tenant = rt.r.hget(keys.job(job_id), "owner")  # type: ignore[assignment]
        except redis.RedisError:
            pass
    with logs.bind(job_id=job_id, tenant=tenant, model=rt.model, worker=rt.worker_id):
        return _run_job(rt, job_id, taken)


def _run_job(rt: WorkerRuntime, job_id: str,
             taken: tuple[AcquireResult, float, float] | None) -> tuple[str, str]:
    """`taken`: a ticket's pick already leased it (what it answered, when it ran)."""
    if taken is None:
        _engine_alive(rt)
        acquire_start = time.time()
        got = rt.store.acquire(job_id, rt.worker_id)
        acquire_end = time.time()
    else:
        got, acquire_start, acquire_end = taken
    if not isinstance(got, Acquired):
        log.info("job %s: not run (%s)", job_id, got.reason)
        return str(got.reason), ""
    log.info("job %s: attempt %d started", job_id, got.attempt,
             extra={"attempt": got.attempt})
    started = time.time()
    if got.cancel_requested:  # cancelled while its message was on the way
        rt.store.finish(Ending(job_id, got.attempt, "cancelled",
                               {"finished_at": repr(time.time())}, EVENT_CANCELLED, dumps({})))
        return "cancelled", ""
    handle = submit(rt, job_id, got)
    rt.cancels.watch(job_id, got.attempt)
    try:
        outcome = wait(rt, job_id, got.attempt, handle)
        try:
            observe(rt, job_id, started, handle)
            trace(rt, job_id, got.attempt, (acquire_start, acquire_end), handle)
        except redis.RedisError:
            log.warning("job %s: metrics skipped (Redis unavailable)", job_id)
        return outcome, handle.take_next if outcome == "preempted" else ""
    finally:
        rt.cancels.unwatch(job_id, got.attempt)
        rt.publisher.untrack(job_id, got.attempt)


def submit(rt: WorkerRuntime, job_id: str, got: Acquired) -> JobHandle:
    """Hand the job to the engine. A takeover continues where the dead attempt stopped:
    prefill prompt + the tokens clients already have, and number the new ones after them
    (no gap, no duplicate)."""
    token_ids, texts = emitted(rt.r, job_id) if got.attempt > 1 else ([], [])
    spec = got.spec
    rec: list[str | None] = rt.r.hmget(  # type: ignore[assignment]
        keys.job(job_id), ["priority", "preemptions"])
    priority, preemptions = rec
    guard_grammar(rt, job_id, got.attempt, spec.params)
    handle = rt.publisher.track(job_id, got.attempt, emitted=texts,
                                preemptable=spec.params.cache_prompt,
                                priority=priority or "normal", preemptions=int(preemptions or 0))
    try:
        rt.engine.submit(EngineRequest(
            job_id=job_id, attempt=got.attempt, prompt=spec.prompt, messages=spec.messages,
            tools=spec.tools, resume_token_ids=token_ids, inputs=spec.inputs, params=spec.params,
            adapter=spec.adapter, urgent=priority == "high",
            background=priority == "low"))
    except BaseException:
        rt.publisher.untrack(job_id, got.attempt)
        raise
    return handle


def guard_grammar(rt: WorkerRuntime, job_id: str, attempt: int, params: SamplingParams) -> None:
    """Compile the job's grammar once here, with the job marked `grammar_probe` meanwhile:
    if that kills the process (a schema the API's budgets let through, llama.cpp
    segfaulting), the mark outlives it and the next acquire fails the job as poison
    (shared/lua/acquire.lua) instead of handing it to another worker to kill."""
    check = getattr(rt.engine, "check_grammar", None)
    if params.json_schema is None or check is None:
        return
    try:
        rt.store.mark_grammar(job_id, attempt)
    except redis.RedisError:  # Redis away: run unguarded (max_attempts still bounds it)
        log.warning("job %s: grammar mark not written (Redis unavailable)", job_id)
        return
    try:
        check(params)
    except Exception:  # the engine refuses it again on admission, with the reason
        log.warning("job %s: its grammar does not compile", job_id, exc_info=True)
    try:
        rt.store.clear_grammar(job_id)
    except redis.RedisError:
        # The mark stays: if this worker dies before the job ends, the job is failed as
        # poison rather than retried; a job that ends normally never looks at it again.
        log.warning("job %s: grammar mark not cleared (Redis unavailable)", job_id)


def wait(rt: WorkerRuntime, job_id: str, attempt: int, handle: JobHandle) -> str:
    """Until the publisher has ended the job: give the job back if the engine dies, stop
    waiting once the lease is lost. The handle's outcome. Each of those nudges the handle
    (the publisher, the lease renewal, the heartbeat that finds the engine dead), so the
    thread sleeps until one of them happens."""
    while True:
        handle.nudge.wait(WATCHDOG_S)
        handle.nudge.clear()  # what set it was written before: the looks below see it
        if handle.done.is_set():
            break
        if rt.engine_dead.is_set() or not rt.engine.healthy():  # (dead, or stalled in C)
            # Not the job's fault: another worker continues it from its tokens.
            log.error("job %s: the engine died; handing the job back", job_id)
            rt.drainer.hand_back(job_id, attempt)
            return "handed_back"
        if handle.outcome == "fenced":
            # lease lost: a newer attempt owns the job; wait for the engine to let go
            handle.done.wait(FENCED_LET_GO_S)
            break
    return handle.outcome


def observe(rt: WorkerRuntime, job_id: str, started: float,
            handle: JobHandle) -> None:
    """Latencies are measured from the job's creation, so they include the queue."""
    m, model, now = rt.metrics, rt.model, time.time()
    if handle.outcome in ("succeeded", "failed", "cancelled"):
        m.jobs.labels(model, handle.outcome).inc()
    prompt, completion = handle.usage
    m.prompt_tokens.labels(model).inc(prompt)
    m.generation_tokens.labels(model).inc(max(0, completion - handle.resumed))
    if handle.outcome == "succeeded" and not handle.resumed:  # the pace placement reads
        rt.pace.observe(started=started, first_token_at=handle.first_token_at, ended=now,
                        prompt=prompt, completion=completion)
    if handle.outcome != "succeeded":
        return  # (a preempted job's slot is taken again sooner without the read)
    # Every job that succeeds is measured once, by the attempt that finished it, from the
    # job's creation: a preempted or taken-over job too (queue time ends at its first start,
    # its first token is the one an earlier attempt streamed).
    rec: list[str | None] = rt.r.hmget(  # type: ignore[assignment]
        keys.job(job_id), ["created_at", "started_at"])
    if not rec[0]:
        return
    t0 = float(rec[0])
    m.queue_time.labels(model).observe(max(0.0, float(rec[1] or started) - t0))
    m.e2e.labels(model).observe(max(0.0, now - t0))
    first = first_token_time(rt.r, job_id) if handle.resumed else handle.first_token_at
    if first is not None:
        m.ttft.labels(model).observe(max(0.0, first - t0))
    ours = completion - handle.resumed  # this attempt's tokens, the first at first_token_at
    if handle.first_token_at is not None and ours > 1:
        m.tpot.labels(model).observe((now - handle.first_token_at) / (ours - 1))


def first_token_time(r: redis.Redis, job_id: str) -> float | None:
    """When the job's first token reached its stream (its entry id is the write's time in
    milliseconds): the time to first token of a job an earlier attempt began."""
    entries: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
        keys.job_events(job_id), count=FIRST_TOKEN_LOOK)
    for entry_id, fields in entries:
        if fields.get("e") == "token":
            return int(entry_id.split("-")[0]) / 1000
    return None


def trace(rt: WorkerRuntime, job_id: str, attempt: int, acquired: tuple[float, float],
          handle: JobHandle) -> None:
    """The attempt's spans (acquire, queue wait, first token, writes), children of the
    request that created the job, where tracing is on."""
    if not tracing.enabled():
        return
    got: list[str | None] = rt.r.hmget(  # type: ignore[assignment]
        keys.job(job_id), ["traceparent", "created_at"])
    parent, created = got
    tracing.record_attempt(
        parent, {"tokenq.job_id": job_id, "tokenq.attempt": attempt,
                 "tokenq.worker": rt.worker_id, "tokenq.model": rt.model,
                 "tokenq.outcome": handle.outcome},
        tracing.AttemptTimes(float(created) if created else None, acquired[0], acquired[1],
                             handle.first_token_at, handle.last_write, handle.writes,
                             handle.write_s), time.time())


def emitted(r: redis.Redis, job_id: str) -> tuple[list[int], list[str]]:
    """Token ids and texts already in the job's stream, in index order."""
    ids: list[int] = []
    texts: list[str] = []
    entries: list[tuple[str, dict[str, str]]] = r.xrange(  # type: ignore[assignment]
        keys.job_events(job_id))
    for _, fields in entries:
        if fields.get("e") == "token":
            data = json.loads(fields["d"])
            if data["index"] == len(ids):  # contiguous by construction; guard anyway
                ids.append(int(fields["t"]))
                texts.append(data["text"])
    return ids, texts
