"""The generate task: take the lease, hand the job to the engine, wait, let go.

Celery runs this on a threads pool with concurrency = engine slots, so one
worker process keeps that many jobs in flight against its one engine. The task
thread does no per-token work: the engine emits steps, the publisher writes
them, and this thread only watches for cancel and waits for the end.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import redis
from celery.exceptions import Reject
from prometheus_client import start_http_server

from shared import keys
from shared.adapters import AdapterRef
from shared.celery_app import create_celery, task_message
from shared.jobs import Acquired, Ending, dumps
from shared.metrics import WorkerMetrics
from shared.schemas import EVENT_CANCELLED, SamplingParams
from shared.settings import ModelConfig, Settings
from shared.store import JobStore
from workers.adapters import AdapterWatcher
from workers.engines.base import Engine, EngineRequest
from workers.publisher import JobHandle, Publisher
from workers.webhooks import WebhookSender

log = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25


@dataclass
class WorkerRuntime:
    """Everything a worker process owns; built in the worker start hook, never at import."""

    settings: Settings
    model: str
    cfg: ModelConfig
    engine: Engine
    r: redis.Redis
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    publisher: Publisher = field(init=False)
    _stop: threading.Event = field(default_factory=threading.Event)
    engine_dead: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.store = JobStore(self.r, self.settings)
        self.publisher = Publisher(self.store, on_cancel=self.engine.cancel)
        self._next_rescue = 0.0
        self.metrics = WorkerMetrics()
        self.metrics_port: int | None = None
        self.metrics_host = ""
        self.celery = create_celery(self.settings)
        self.webhooks = WebhookSender(self.r, self.settings)
        self.adapters = AdapterWatcher(self.r, self.engine, self.model, self.worker_id,
                                       self.settings.adapter_poll_s)
        self._heart = threading.Thread(target=self._heartbeat, name="tokenq-heartbeat",
                                       daemon=True)

    def start(self) -> None:
        if self.settings.worker_metrics_port is not None:
            server, _ = start_http_server(self.settings.worker_metrics_port,
                                          addr=self.settings.worker_metrics_addr,
                                          registry=self.metrics.registry)
            self.metrics_port = int(server.server_port)
            self.metrics_host = self._metrics_host()
        self.publisher.start()
        self.engine.start(self.publisher.sink)
        self.adapters.start()
        self._beat()
        self._heart.start()
        self.webhooks.start()
        log.info("worker %s serving %s on %s (%d slots)", self.worker_id, self.model,
                 self.engine.backend, self.engine.slots)

    def close(self) -> None:
        self._stop.set()
        self.adapters.stop()
        self.webhooks.stop()
        self.engine.close()
        self.publisher.stop()
        try:
            self.r.hdel(keys.WORKERS, self.worker_id)
        except redis.RedisError:
            pass

    # -- heartbeat and leases ------------------------------------------------------------
    def _beat(self) -> None:
        st = self.engine.stats()
        info = {"model": self.model, "backend": self.engine.backend, "slots": st.slots,
                "running": st.running, "waiting": st.waiting,
                "kv_cache_usage": st.kv_cache_usage, "prefix_hit_ratio": st.prefix_hit_ratio,
                "metrics_port": self.metrics_port, "metrics_host": self.metrics_host,
                "ts": time.time(), "pid": os.getpid(), "adapters": self.adapters.summary()}
        self.r.hset(keys.WORKERS, self.worker_id, dumps(info))
        self.metrics.kv_cache.labels(self.model).set(st.kv_cache_usage)
        self.metrics.prefix_hit.labels(self.model).set(st.prefix_hit_ratio)

    def _metrics_host(self) -> str:
        """Where Prometheus reaches this worker's metrics port (the API's /metrics/targets)."""
        s = self.settings
        if s.worker_metrics_host:
            return s.worker_metrics_host
        bound = s.worker_metrics_addr
        if bound not in ("", "0.0.0.0", "::"):
            return bound
        # Bound to all: this host's address as its own /etc/hosts has it (a container's or
        # pod's IP), which resolves from anywhere on its network, unlike a container id.
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return socket.gethostname()

    def _heartbeat(self) -> None:
        next_reconcile = time.monotonic()
        last = time.monotonic()
        while not self._stop.wait(self.settings.heartbeat_s):
            now = time.monotonic()
            if now - last > self.settings.lease_ttl_s / 2:
                log.warning("heartbeat %.1f s late (process or machine stalled); leases may "
                            "have expired", now - last - self.settings.heartbeat_s)
            last = now
            if not self.engine.healthy():
                self._engine_died()
                return
            try:
                # Leases first: after a stall, this worker's own reconcile must not find its
                # own jobs' leases expired and hand them to another attempt.
                self._renew_leases()
                self._beat()
                if time.monotonic() >= next_reconcile:
                    self.reconcile()
                    next_reconcile = time.monotonic() + self.settings.reconcile_s
            except redis.RedisError:
                log.exception("heartbeat failed")

    def _renew_leases(self) -> None:
        handles = [h for h in self.publisher.tracked() if not h.released]
        held = self.store.renew([(h.job_id, h.attempt) for h in handles], self.worker_id)
        for h, ok in zip(handles, held, strict=True):
            if not ok and not h.done.is_set():
                log.warning("job %s: lease lost; aborting attempt %d", h.job_id, h.attempt)
                h.outcome = "fenced"
                self.engine.cancel(h.job_id)

    def _engine_died(self) -> None:
        """The engine cannot serve again: leave /ready at once (no more heartbeats), let the
        task threads hand their jobs back, and stop the process so a supervisor starts a
        fresh one (`tokenq up` restarts workers; in k8s the pod restarts)."""
        log.error("worker %s: the %s engine died; leaving the pool", self.worker_id,
                  self.engine.backend)
        self.engine_dead.set()
        try:
            self.r.hdel(keys.WORKERS, self.worker_id)
        except redis.RedisError:
            log.exception("could not remove the heartbeat")
        os.kill(os.getpid(), signal.SIGTERM)  # Celery warm shutdown: stop consuming

    # -- the task body -------------------------------------------------------------------
    def run_job(self, job_id: str) -> str:
        if self.engine_dead.is_set() or not self.engine.healthy():
            # This worker is on its way out; leave the message for a live one.
            time.sleep(0.5)
            raise Reject("the worker's engine is dead", requeue=True)
        got = self.store.acquire(job_id, self.worker_id)
        if not isinstance(got, Acquired):
            log.info("job %s: not run (%s)", job_id, got.reason)
            return str(got.reason)
        attempt, spec = got.attempt, got.spec
        started = time.time()
        if got.cancel_requested:  # cancelled while its message was on the way
            self._end(job_id, attempt, "cancelled", EVENT_CANCELLED, {})
            return "cancelled"
        # A takeover continues where the dead attempt stopped: prefill prompt + the tokens
        # clients already have, and number the new ones after them (no gap, no duplicate).
        token_ids, texts = self._emitted(job_id) if attempt > 1 else ([], [])
        handle = self.publisher.track(job_id, attempt, emitted=texts)
        try:
            self.engine.submit(EngineRequest(
                job_id=job_id, attempt=attempt, prompt=spec.get("prompt"),
                messages=spec.get("messages"), resume_token_ids=token_ids,
                params=SamplingParams.model_validate(spec["params"]),
                adapter=AdapterRef.model_validate(spec["adapter"]) if spec.get("adapter")
                else None))
            cancel_sent = False
            while not handle.done.wait(CANCEL_POLL_S):
                if not cancel_sent and self._cancel_requested(job_id):
                    self.engine.cancel(job_id)
                    cancel_sent = True
                if not self.engine.healthy():
                    # Not the job's fault: another worker continues it from its tokens.
                    log.error("job %s: the engine died; handing the job back", job_id)
                    self.hand_back(job_id, attempt)
                    return "handed_back"
                if handle.outcome == "fenced":
                    # lease lost: a newer attempt owns the job; wait for the engine to let go
                    handle.done.wait(5)
                    break
            try:
                self._observe(job_id, attempt, started, handle)
            except redis.RedisError:
                log.warning("job %s: metrics skipped (Redis unavailable)", job_id)
            return handle.outcome
        finally:
            self.publisher.untrack(job_id)

    def _cancel_requested(self, job_id: str) -> bool:
        """A Redis outage must not end the task: the engine goes on generating, the
        publisher holds its writes until Redis is back, the lease decides who owns the job."""
        try:
            return self.r.hget(keys.job(job_id), "cancel_requested") == "1"
        except redis.RedisError:
            return False

    def _observe(self, job_id: str, attempt: int, started: float, handle: JobHandle) -> None:
        """Latencies are measured from the job's creation, so they include the queue."""
        m, model, now = self.metrics, self.model, time.time()
        if handle.outcome in ("succeeded", "failed", "cancelled"):
            m.jobs.labels(model, handle.outcome).inc()
        prompt, completion = handle.usage
        m.prompt_tokens.labels(model).inc(prompt)
        m.generation_tokens.labels(model).inc(max(0, completion - handle.resumed))
        created = self.r.hget(keys.job(job_id), "created_at")
        if attempt != 1 or not created or handle.outcome != "succeeded":
            return
        t0 = float(created)
        m.queue_time.labels(model).observe(max(0.0, started - t0))
        m.e2e.labels(model).observe(max(0.0, now - t0))
        if handle.first_token_at is not None:
            m.ttft.labels(model).observe(max(0.0, handle.first_token_at - t0))
            if completion > 1:
                m.tpot.labels(model).observe((now - handle.first_token_at) / (completion - 1))

    def _emitted(self, job_id: str) -> tuple[list[int], list[str]]:
        """Token ids and texts already in the job's stream, in index order."""
        ids: list[int] = []
        texts: list[str] = []
        entries: list[tuple[str, dict[str, str]]] = self.r.xrange(  # type: ignore[assignment]
            keys.job_events(job_id))
        for _, fields in entries:
            if fields.get("e") == "token":
                data = json.loads(fields["d"])
                if data["index"] == len(ids):  # contiguous by construction; guard anyway
                    ids.append(int(fields["t"]))
                    texts.append(data["text"])
        return ids, texts

    def reconcile(self) -> int:
        """Re-enqueue jobs no message will deliver: running ones whose lease expired (their
        worker died) and queued ones whose message a dying worker popped (see REQUEUE). Any
        worker may run this; the script checks and pushes atomically, so at most once."""
        running: list[str] = self.r.zrange(keys.RUNNING, 0, -1)  # type: ignore[assignment]
        pipe = self.r.pipeline(transaction=False)
        for job_key in running:
            pipe.exists(keys.job_lease(keys.job_id_of(job_key)))
        stale = [k for k, alive in zip(running, pipe.execute(), strict=True) if not alive]
        # Lost messages are rare: look for them every rescue_after_s / 2, not every pass,
        # and only at the oldest queued jobs (a popped message is at the consuming end).
        now = time.time()
        if now >= self._next_rescue:
            self._next_rescue = now + self.settings.rescue_after_s / 2
            oldest: list[str] = self.r.zrangebyscore(  # type: ignore[assignment]
                keys.QUEUED, 0, now - self.settings.rescue_after_s, start=0, num=100)
            stale += oldest
            self._forget_dead_workers(now)
        requeued = 0
        for job_key in stale:
            job_id = keys.job_id_of(job_key)
            rec: list[str | None] = self.r.hmget(  # type: ignore[assignment]
                job_key, ["model", "priority", "state"])
            if not rec[0]:
                self.r.zrem(keys.RUNNING, job_key)
                self.r.zrem(keys.QUEUED, job_key)
                continue
            queue = keys.queue(rec[0], rec[1] or "normal")
            msg = task_message(self.celery, job_id, queue)
            if self.store.requeue(job_id, queue, msg):
                log.warning("job %s (%s): no worker holds it and no message will deliver it; "
                            "re-enqueued", job_id, rec[2])
                requeued += 1
        return requeued

    def _forget_dead_workers(self, now: float) -> None:
        """Drop heartbeats of workers silent for 3 x worker_ttl_s (SIGKILLed: they never
        said goodbye), so /metrics, /v1/admin/workers and slot counts stop showing them.
        A worker that was only paused writes its heartbeat back on its next beat."""
        beats: dict[str, str] = self.r.hgetall(keys.WORKERS)  # type: ignore[assignment]
        cutoff = now - 3 * self.settings.worker_ttl_s
        dead = [w for w, v in beats.items() if json.loads(v).get("ts", 0) < cutoff]
        if dead:
            self.r.hdel(keys.WORKERS, *dead)

    def drain(self) -> None:
        """SIGTERM: Celery stops consuming at once; running jobs get `drain_grace_s` to
        finish, then are handed back and continued by another worker from their tokens."""
        def hand_back_later() -> None:
            deadline = time.monotonic() + self.settings.drain_grace_s
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
            handle.done.wait(5)  # every token step before the cancel has been written
        rec: list[str | None] = self.r.hmget(  # type: ignore[assignment]
            keys.job(job_id), ["model", "priority"])
        queue = keys.queue(rec[0] or self.model, rec[1] or "normal")
        ok = self.store.hand_back(job_id, self.worker_id, attempt, queue,
                                  task_message(self.celery, job_id, queue))
        log.warning("job %s: handed back (%s)", job_id, "requeued" if ok else "not ours")

    def _end(self, job_id: str, attempt: int, state: str, event: str, data: dict[str, str],
             **fields: str) -> None:
        """Terminal write outside the engine path (fenced by attempt, like the publisher's)."""
        self.store.finish(Ending(job_id, attempt, state,
                                 {"finished_at": repr(time.time()), **fields}, event,
                                 dumps(data)))


_runtime: WorkerRuntime | None = None


def set_runtime(rt: WorkerRuntime | None) -> None:
    global _runtime
    _runtime = rt


def generate(job_id: str) -> str:
    """Celery task `tokenq.generate`: run one job on this process's engine."""
    if _runtime is None:
        raise RuntimeError("worker runtime is not started")
    return _runtime.run_job(job_id)
