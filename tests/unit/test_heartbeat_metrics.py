"""The heartbeat exports what the engine counts: Prometheus' counter follows the engine's
count of stopped steps by the difference since the last beat (never down, never twice)."""

from __future__ import annotations

from unittest.mock import MagicMock

from tokenq.shared.metrics import WorkerMetrics
from tokenq.shared.settings import Settings
from tokenq.workers.engines.base import EngineStats
from tokenq.workers.heartbeat import Heartbeat


class CountingEngine:
    backend = "llamacpp"

    def __init__(self) -> None:
        self.stopped = 0

    def stats(self) -> EngineStats:
        return EngineStats(running=1, waiting=0, slots=8, kv_cache_usage=0.0,
                           stopped_steps=self.stopped)


def test_stopped_steps_counter_follows_the_engine() -> None:
    engine, metrics = CountingEngine(), WorkerMetrics()
    adapters = MagicMock()
    adapters.summary.return_value = {}
    hb = Heartbeat(r=MagicMock(), settings=Settings(), worker_id="w1", model="m",
                   engine=engine, adapters=adapters, metrics=metrics,  # type: ignore[arg-type]
                   leases=MagicMock(), reconciler=MagicMock(), on_engine_died=MagicMock(),
                   on_redis_gone=MagicMock())

    def exported() -> float | None:
        return metrics.registry.get_sample_value("tokenq_engine_steps_stopped_total",
                                                 {"model": "m"})

    seen = []
    for count in (0, 3, 3, 5):
        engine.stopped = count
        hb.beat()
        seen.append(exported() or 0.0)
    assert seen == [0.0, 3.0, 3.0, 5.0]
