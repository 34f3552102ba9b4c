"""Turns engine steps into Redis writes: one pipeline per step for all in-flight jobs.

The engine thread only enqueues its StepOutput here (no I/O on the engine
thread). This thread coalesces whatever steps are waiting, writes every job's
token events (the store's fenced `append`) and every finished job (`finish`) in
one round trip, then wakes the Celery task threads whose jobs ended.

Streams stay contiguous across a Redis failover. Replication is asynchronous, so the
promoted replica may lack the last events this attempt wrote. Every `append` answers
where the job's stream really ends; when that is short of what this attempt sent, the
missing tokens are re-sent from the attempt's own record of them (`JobHandle.sent`,
one entry per token, bounded by max_tokens), with the entry ids they had, so a client
resuming with Last-Event-ID neither misses nor repeats one. `finish` is checked the
same way: a job ends only once its stream holds every token, so the terminal record's
output is the concatenated stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import redis

from tokenq.shared.jobs import (
    Appended,
    AppendResult,
    Ended,
    Ending,
    FinishResult,
    TokenWrite,
    dumps,
)
from tokenq.shared.schemas import EVENT_CANCELLED, EVENT_DONE, EVENT_ERROR
from tokenq.shared.store import JobStore
from tokenq.workers.engines.base import Finished, StepOutput, TokenDelta

log = logging.getLogger(__name__)

# Re-send rounds per step before giving up on a stream that stays short (each round fills
# the gap unless Redis fails over again meanwhile; then the step is retried whole).
RESEND_ROUNDS = 3


@dataclass(eq=False)
class JobHandle:
    """What a task thread waits on while the engine runs its job."""

    job_id: str
    attempt: int
    done: threading.Event = field(default_factory=threading.Event)
    # Set whenever the task thread must look again: the attempt ended here (`finish`), its
    # lease was lost (workers/leases.py), or the engine died (`Publisher.wake_all`). The
    # thread sleeps on it rather than polling (workers/tasks.py `wait`).
    nudge: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # succeeded | failed | cancelled | fenced | handed_back | preempted
    text: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    usage: tuple[int, int] = (0, 0)  # prompt, completion tokens, set when the job ends
    resumed: int = 0  # tokens an earlier attempt streamed (a takeover continues after them)
    released: bool = False  # handed back: its lease is no longer renewed
    # May be preempted (workers/preempt.py); not a job that asked for exact text
    # (cache_prompt false), whose greedy text must not depend on what else ran.
    preemptable: bool = True
    # The job's lane and how often it was preempted before this attempt (fixed for the
    # attempt): what the preemptor weighs each look without reading the record again.
    priority: str = "normal"
    preemptions: int = 0
    # Preempted for the next job of this lane: its task thread takes that job itself
    # (workers/tasks.py), set with outcome "preempted".
    take_next: str = ""
    # This attempt's token writes, by index - resumed, and the entry id the stream gave each
    # ("" until known): what a failover lost is re-sent from here.
    sent: list[TokenWrite] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    resent: int = 0  # tokens written again: those a failover lost, and those queued behind
    # Redis writes that carried this job's events (tracing): count, seconds, and the
    # (start, end) of the latest one (the terminal event's, once done).
    writes: int = 0
    write_s: float = 0.0
    last_write: tuple[float, float] | None = None

    def finish(self, outcome: str) -> None:
        """The attempt is over on this worker: record why and wake its task thread."""
        self.outcome = outcome
        self.done.set()
        self.nudge.set()

    @property
    def end(self) -> int:
        """The stream's token count once this attempt's writes are all in."""
        return self.resumed + len(self.sent)

    def remember(self, write: TokenWrite, text: str) -> None:
        """Record a token before it is written (by index: a retried step records it again)."""
        if write.index < len(self.text):
            self.text[write.index] = text
        else:
            self.text.append(text)
        at = write.index - self.resumed
        if 0 <= at < len(self.sent):
            self.sent[at] = write
        elif at >= 0:
            self.sent.append(write)
            self.ids.append("")

    def written(self, got: AppendResult) -> None:
        """Note the entry ids an append gave this attempt's tokens."""
        first = got.stream_end - len(got.ids) - self.resumed
        for at, entry_id in enumerate(got.ids, start=first):
            if 0 <= at < len(self.ids):
                self.ids[at] = entry_id

    def missing(self, stream_end: int) -> list[TokenWrite]:
        """This attempt's tokens from index `stream_end` on, each with the entry id it had
        (none if an earlier attempt's are missing too: those are not held here)."""
        if stream_end < self.resumed:
            return []
        at = stream_end - self.resumed
        return [replace(w, entry_id=i) for w, i in zip(self.sent[at:], self.ids[at:], strict=True)]


class Publisher:
    def __init__(self, store: JobStore, on_cancel: Callable[[str], None] | None = None):
        self._store = store
        # A token write answers CANCEL_REQUESTED when the job's cancel was requested: the
        # engine hears of it within one step, with no extra round trip (the task threads'
        # poll is the fallback for jobs that are not producing tokens, e.g. in a long
        # prefill).
        self._on_cancel = on_cancel
        self._cancelled: set[str] = set()  # told the engine once (publisher thread only)
        self._steps: queue.SimpleQueue[StepOutput | None] = queue.SimpleQueue()
        self._handles: dict[str, JobHandle] = {}
        # Attempts handed back on drain: nothing more is written for them, ever (a late
        # finish could otherwise land before the next attempt's acquire bumps the fence).
        self._dropped: set[tuple[str, int]] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tokenq-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._steps.put(None)
        self._thread.join(timeout=10)

    def track(self, job_id: str, attempt: int, emitted: list[str] | None = None, *,
              preemptable: bool = True, priority: str = "normal",
              preemptions: int = 0) -> JobHandle:
        """Follow a job; `emitted` is the text an earlier attempt already streamed. The
        handle is whole before the preemptor can see it."""
        handle = JobHandle(job_id, attempt, text=list(emitted or []), resumed=len(emitted or []),
                           preemptable=preemptable, priority=priority, preemptions=preemptions)
        with self._lock:
            self._handles[job_id] = handle
        return handle

    def drop(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._dropped.add((job_id, attempt))

    def untrack(self, job_id: str, attempt: int) -> None:
        """Stop following the job's `attempt`; a newer attempt this worker took meanwhile
        (a takeover of its own fenced-off attempt) stays followed."""
        with self._lock:
            handle = self._handles.get(job_id)
            if handle is None or handle.attempt != attempt:
                return
            del self._handles[job_id]
        self._cancelled.discard(job_id)

    def current(self, job_id: str) -> JobHandle | None:
        """The handle of the job's attempt this worker follows now (the newest)."""
        with self._lock:
            return self._handles.get(job_id)

    def tracked(self) -> list[JobHandle]:
        with self._lock:
            return list(self._handles.values())

    def wake_all(self) -> None:
        """Wake every task thread to look at its job again (the engine died)."""
        for handle in self.tracked():
            handle.nudge.set()

    def sink(self, step: StepOutput) -> None:
        """Called on the engine thread: hand off and return at once."""
        self._steps.put(step)

    def _run(self) -> None:
        while True:
            step = self._steps.get()
            if step is None:
                return
            merged = StepOutput(list(step.tokens), list(step.finished))
            steps = [step]
            last = False
            while True:  # coalesce steps that queued up while we were writing
                try:
                    more = self._steps.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    last = True
                    break
                steps.append(more)
                merged.tokens.extend(more.tokens)
                merged.finished.extend(more.finished)
            self._write_until_done(merged)
            for s in steps:
                s.flushed.set()
            if last:
                return

    def _write_until_done(self, step: StepOutput) -> None:
        """Retry a failed step until Redis answers again (it may be restarting): dropping
        it would leave a gap in the job's stream. Replays are safe: `append` writes a token
        only at its own index and `finish` ends a job only once. Meanwhile the engine's later steps
        queue up here; if the outage outlives the lease, another worker takes the job
        over and these writes are fenced off."""
        delay = 0.1
        while True:
            try:
                self._write(step)
                return
            except redis.RedisError as exc:
                if self._stopping:
                    log.error("publisher: stopping with an unwritten step (%s)", exc)
                    return
                log.warning("publisher: Redis write failed (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(2.0, delay * 2)

    def _write(self, step: StepOutput) -> None:
        if self._dropped:
            step = StepOutput(
                [t for t in step.tokens if (t.job_id, t.attempt) not in self._dropped],
                [f for f in step.finished if (f.job_id, f.attempt) not in self._dropped])
            for h in self.tracked():
                if (h.job_id, h.attempt) in self._dropped:
                    h.finish(h.outcome or "handed_back")  # or "preempted"
        by_job: dict[tuple[str, int], list[TokenDelta]] = defaultdict(list)
        for t in step.tokens:
            by_job[(t.job_id, t.attempt)].append(t)
        tokens: dict[tuple[str, int], list[TokenWrite]] = {}
        for job, toks in by_job.items():
            tokens[job] = [TokenWrite(dumps(_token_event(t)), t.token_id, t.index)
                           for t in toks]
            # The handles' text feeds the ending's `output` below, their `sent` a re-send.
            handle = self._handle(job)
            if handle is not None:
                for t, w in zip(toks, tokens[job], strict=True):
                    handle.remember(w, t.text)
        now = time.time()
        endings = [self._ending(f) for f in step.finished]
        t_write = time.time()
        appended, ended = self._store.write_step(tokens, endings)
        t_done = time.time()
        for job_id in {*(j for j, _ in tokens), *(f.job_id for f in step.finished)}:
            handle = self._handles.get(job_id)
            if handle is not None:
                handle.writes += 1
                handle.write_s += t_done - t_write
                handle.last_write = (t_write, t_done)
        for job_id, _ in tokens:
            handle = self._handles.get(job_id)
            if handle is not None and handle.first_token_at is None:
                handle.first_token_at = now
        self._appended(tokens, appended)
        self._settle(step.finished, ended)
        if any(got.stream_end < self._end(job) for job, got in zip(tokens, appended, strict=True)
               if got.status is not Appended.FENCED) or any(
                   got.status is Ended.SHORT for got in ended):
            self._fill_gaps(tokens, appended, step.finished, endings, ended)

    def _handle(self, job: tuple[str, int]) -> JobHandle | None:
        handle = self._handles.get(job[0])
        return handle if handle is not None and handle.attempt == job[1] else None

    def _end(self, job: tuple[str, int]) -> int:
        handle = self._handle(job)
        return -1 if handle is None else handle.end

    def _appended(self, tokens: dict[tuple[str, int], list[TokenWrite]],
                  appended: list[AppendResult]) -> None:
        for (job_id, attempt), got in zip(tokens, appended, strict=True):
            if got.status is Appended.FENCED:
                log.warning("job %s: token write fenced off (newer attempt or job ended)", job_id)
                continue
            handle = self._handle((job_id, attempt))
            if handle is not None:
                handle.written(got)
            if (got.status is Appended.CANCEL_REQUESTED and self._on_cancel is not None
                    and job_id not in self._cancelled):
                self._cancelled.add(job_id)
                self._on_cancel(job_id)

    def _settle(self, finished: list[Finished], ended: list[FinishResult]) -> None:
        """Wake the task threads of the jobs whose ending was written or fenced off (a
        SHORT one waits for its re-send; a handle already done keeps its outcome when a
        retried step finds its job ended)."""
        for f, got in zip(finished, ended, strict=True):
            handle = self._handles.get(f.job_id)
            if (got.status is Ended.SHORT or handle is None or handle.attempt != f.attempt
                    or handle.done.is_set()):
                continue
            handle.usage = (f.prompt_tokens, f.completion_tokens)
            handle.finish(self._outcome(f) if got.status is Ended.ENDED else "fenced")

    def _fill_gaps(self, tokens: dict[tuple[str, int], list[TokenWrite]],
                   appended: list[AppendResult], finished: list[Finished],
                   endings: list[Ending], ended: list[FinishResult]) -> None:
        """A stream that ends short of what this attempt sent lost its tail in a failover:
        re-send the tail from the handle (in order, with the entry ids it had), then the
        endings that waited for it. An error propagates: the whole step is retried."""
        ends = {job: got.stream_end for job, got in zip(tokens, appended, strict=True)
                if got.status is not Appended.FENCED}
        ended = list(ended)
        for _ in range(RESEND_ROUNDS):
            for e, got in zip(endings, ended, strict=True):
                if got.status is Ended.SHORT:
                    ends[(e.job_id, e.attempt)] = got.stream_end
            resend: dict[tuple[str, int], list[TokenWrite]] = {}
            for job, n in ends.items():
                handle = self._handle(job)
                if handle is not None and n < handle.end and handle.missing(n):
                    resend[job] = handle.missing(n)
                    handle.resent += len(resend[job])
                    log.warning("job %s: the stream ends at token %d, attempt %d sent %d (lost "
                                "in a Redis failover); re-sending %d", job[0], n, job[1],
                                handle.end, len(resend[job]))
            retry = [i for i, got in enumerate(ended) if got.status is Ended.SHORT]
            if not resend and not retry:
                return
            got_a, got_e = self._store.write_step(resend, [endings[i] for i in retry])
            self._appended(resend, got_a)
            ends = {job: got.stream_end for job, got in zip(resend, got_a, strict=True)
                    if got.status is not Appended.FENCED}
            for i, got in zip(retry, got_e, strict=True):
                ended[i] = got
            self._settle(finished, ended)
        short = [i for i, got in enumerate(ended) if got.status is Ended.SHORT]
        if short:  # not re-sendable from here (not this attempt's tokens): end as before
            for i in short:
                log.error("job %s: its stream stays short of the tokens sent; ending it "
                          "unchecked", endings[i].job_id)
            _, got_e = self._store.write_step(
                {}, [replace(endings[i], tokens=None) for i in short])
            for i, got in zip(short, got_e, strict=True):
                ended[i] = got
            self._settle(finished, ended)

    def _ending(self, f: Finished) -> Ending:
        state, event, data, fields = self._terminal(f)
        handle = self._handle((f.job_id, f.attempt))
        return Ending(f.job_id, f.attempt, state, fields, event, dumps(data),
                      tokens=None if handle is None else handle.end)

    def _terminal(self, f: Finished) -> tuple[str, str, dict[str, object], dict[str, str]]:
        handle = self._handles.get(f.job_id)
        fields: dict[str, str] = {"finished_at": repr(time.time())}
        usage = {"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
                 "total_tokens": f.prompt_tokens + f.completion_tokens}
        fields["usage"] = dumps(usage)
        if f.output is not None:
            fields["output"] = f.output
        elif handle is not None:
            fields["output"] = "".join(handle.text)
        if f.reason in ("stop", "length"):
            fields["finish_reason"] = f.reason
            return "succeeded", EVENT_DONE, {"finish_reason": f.reason, "usage": usage}, fields
        if f.reason == "cancelled":
            return "cancelled", EVENT_CANCELLED, {}, fields
        err: dict[str, object] = {"code": f.error_code or "engine_error",
                                  "message": f.error_message or "failed"}
        fields["error"] = dumps(err)
        return "failed", EVENT_ERROR, err, fields

    @staticmethod
    def _outcome(f: Finished) -> str:
        return {"stop": "succeeded", "length": "succeeded", "cancelled": "cancelled"}.get(
            f.reason, "failed")


def _token_event(t: TokenDelta) -> dict[str, object]:
    """A token event's data: its text and index, and its logprobs where asked for."""
    data: dict[str, object] = {"text": t.text, "index": t.index}
    if t.logprobs is not None:
        data["logprobs"] = t.logprobs
    return data
