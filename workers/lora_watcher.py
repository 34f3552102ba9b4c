"""The worker's adapter watcher: keeps the engine's loaded LoRA versions in step with
the registry (shared/lora_registry.py), without a restart.

On every registry change (it blocks on tokenq:adapters:events) and at least every
`adapter_poll_s` it reads tokenq:adapters; for each adapter of this worker's
base model it loads the current version when that changes (then tells the engine the
previous one is no longer served: the engine frees it once its last job ends) and
releases it on unload. After each change it writes its ack (tokenq:adapter:{name}:acks),
which the admin routes wait for. A failed load is acked with the error and not retried
for that version: the API rolls the registry back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from tokenq.shared import keys
from tokenq.shared.lora_registry import AdapterAck, AdapterRecord, AdapterRef
from tokenq.workers.engines.base import Engine

log = logging.getLogger(__name__)

# The longest one wait on the change stream (a stop is seen within it; an idle worker
# wakes about once per wait, not once per `adapter_poll_s` of old).
MAX_BLOCK_S = 1.0
RETRY_S = 1.0  # after a failed read, the wait before the next try


class AdapterWatcher:
    def __init__(self, r: redis.Redis, engine: Engine, model: str, worker_id: str,
                 poll_s: float, block_s: float = MAX_BLOCK_S):
        self.r, self.engine, self.model, self.worker_id = r, engine, model, worker_id
        self.poll_s = poll_s
        # one XREAD's wait: under the client's socket timeout, and never past a stop
        self.block_ms = max(1, int(min(poll_s, block_s, MAX_BLOCK_S) * 1000))
        self.cursor = "0-0"  # the change stream's last entry the registry was read after
        self.served: dict[str, AdapterRef] = {}  # name -> version new jobs get
        self._acked: dict[str, int] = {}  # name -> version id last acked (0 = none)
        self._read_soon = False  # the read at start failed: read again at the first wait's end
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenq-adapters", daemon=True)

    def start(self) -> None:
        try:  # adapters loaded before this worker started are ready before its jobs
            self.read_all()
        except Exception:
            log.exception("adapter sync at start failed; retrying every %.2f s", RETRY_S)
            self._read_soon = True
        self._thread.start()

    def summary(self) -> dict[str, int]:
        """name -> version id this worker serves (for its heartbeat)."""
        return {name: ref.id for name, ref in list(self.served.items())}

    def stop(self) -> None:
        self._stop.set()

    def read_all(self) -> None:
        """Note where the change stream ends, then read the registry: a change written
        after that read has its entry past the cursor, so the next XREAD returns at once
        (the API writes the registry, then appends its entry)."""
        ends: list[Any] = self.r.xrevrange(  # type: ignore[assignment]
            keys.ADAPTER_EVENTS, count=1)
        self.cursor = str(ends[0][0]) if ends else "0-0"
        self.sync()

    def _run(self) -> None:
        # Block on the change stream (the API appends on every registry write) so a change
        # is acted on in milliseconds. The registry is re-read on each change and at least
        # every poll_s: a safety net (an entry lost to a failover), not the way changes
        # arrive, so an idle worker wakes once per block_ms and reads nothing else.
        due = 0.0 if self._read_soon else time.monotonic() + self.poll_s
        while not self._stop.is_set():
            try:
                got: list[Any] = self.r.xread(  # type: ignore[assignment]
                    {keys.ADAPTER_EVENTS: self.cursor}, count=100, block=self.block_ms)
                if got:
                    self.cursor = str(got[0][1][-1][0])
                    self.sync()
                elif time.monotonic() >= due:
                    self.read_all()
                else:
                    continue
                due = time.monotonic() + self.poll_s
            except redis.RedisError:
                log.warning("adapter registry unavailable; keeping the loaded adapters")
                self._stop.wait(RETRY_S)
                due = 0.0  # then read it all again: Redis may have restarted or failed over
            except Exception:
                log.exception("adapter sync failed")
                self._stop.wait(RETRY_S)
                due = 0.0

    def sync(self) -> None:
        raw: dict[str, str] = self.r.hgetall(keys.ADAPTERS)  # type: ignore[assignment]
        mine = {}
        for name, data in raw.items():
            rec = AdapterRecord.model_validate_json(data)
            if rec.base == self.model:
                mine[name] = rec.ref()
        for name in set(self.served) - set(mine):  # record deleted outright
            self.engine.unload_adapter(self.served.pop(name))
        for name, ref in mine.items():
            self._sync_one(name, ref)

    def _sync_one(self, name: str, ref: AdapterRef | None) -> None:
        cur = self.served.get(name)
        want = ref.id if ref is not None else 0
        if want == self._acked.get(name) and (cur.id if cur else 0) != want:
            return  # a load of this version failed already; the API rolls it back
        if cur is not None and cur.id == want:
            if self._acked.get(name) != want:
                self._ack(name, AdapterAck(id=want))
            return
        t0 = time.perf_counter()
        if ref is None:
            if cur is not None:
                self.engine.unload_adapter(self.served.pop(name))
            if self._acked.get(name) != 0:
                self._ack(name, AdapterAck(id=0, seconds=time.perf_counter() - t0))
            return
        try:
            rank = self.engine.load_adapter(ref)
        except Exception as exc:
            log.warning("adapter %s@%d: load failed: %s", name, ref.id, exc)
            self._ack(name, AdapterAck(id=ref.id, ok=False, error=f"{exc}"))
            return
        if cur is not None:
            self.engine.unload_adapter(cur)  # freed once its jobs in flight end
        self.served[name] = ref
        seconds = time.perf_counter() - t0
        log.info("adapter %s@%d serving (%.3f s)", name, ref.id, seconds)
        self._ack(name, AdapterAck(id=ref.id, seconds=seconds, rank=rank))

    def _ack(self, name: str, ack: AdapterAck) -> None:
        ack.ts = time.time()
        self.r.hset(keys.adapter_acks(name), self.worker_id, ack.model_dump_json())
        self._acked[name] = ack.id
