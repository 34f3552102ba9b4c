"""The preemptor hears the lanes from the steps' writes (real Redis, real Publisher): while
steps are written it sends Redis nothing of its own, a job waiting in a higher lane reaches
it through the next step's write, and with no step written it reads the lanes itself."""

from __future__ import annotations

import threading
import time
from typing import Any
from unittest.mock import MagicMock

import redis

from shared import keys
from shared.store import JobStore
from tests.integration.test_job_state import SETTINGS
from workers.engines.base import StepOutput
from workers.preempt import LANES, Preemptor
from workers.publisher import Publisher

MODEL = "m-lanes"
POLL_S = 0.05


class CountingRedis:
    """The preemptor's own client: counts what it sends (pipelines and commands)."""

    def __init__(self, r: redis.Redis):
        self._r = r
        self.sent = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return self._r.pipeline(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._r, name)


def test_the_lanes_come_with_the_steps_writes(r: redis.Redis) -> None:
    settings = SETTINGS.model_copy(
        update={"worker": SETTINGS.worker.model_copy(update={"preempt_poll_s": POLL_S})})
    r.lpush(keys.queue(MODEL, "normal"), "m1", "m2")
    got = JobStore(r, settings).write_step({}, [], [keys.queue(MODEL, lane) for lane in LANES])
    assert (got.appended, got.ended) == ([], [])
    assert got.lengths == [0, 2]  # high, normal: counted in the step's round trip
    r.delete(keys.queue(MODEL, "normal"))

    publisher = Publisher(JobStore(r, settings))
    own = CountingRedis(r)
    engine = MagicMock(slots=1)
    engine.healthy.return_value = True
    preemptor = Preemptor(JobStore(own, settings), settings,  # type: ignore[arg-type]
                          celery=MagicMock(), publisher=publisher, engine=engine,
                          model=MODEL, worker_id="w1")
    polled: list[dict[str, int] | None] = []
    real_poll = preemptor.poll

    def poll(waiting: dict[str, int] | None = None) -> list[str]:
        polled.append(None if waiting is None else dict(waiting))
        return real_poll(waiting)

    preemptor.poll = poll  # type: ignore[method-assign]
    handle = publisher.track("job-a", 1)
    handle.preemptable = False  # every slot taken, and nothing is ever sent back here
    publisher.start()
    stepping = threading.Event()
    stepping.set()

    def steps() -> None:  # an engine stepping every 10 ms (empty steps: only the lanes)
        while stepping.is_set():
            step = StepOutput([], [])
            publisher.sink(step)
            step.flushed.wait(5)
            time.sleep(0.01)

    stepper = threading.Thread(target=steps, daemon=True)
    stepper.start()
    time.sleep(0.1)  # steps are being written
    preemptor.start()
    try:
        time.sleep(10 * POLL_S)
        assert (polled, own.sent) == ([], 0)  # nothing waits: not one read of its own

        r.lpush(keys.queue(MODEL, "high"), "h1")  # an interactive job waits
        deadline = time.monotonic() + 5
        while not polled and time.monotonic() < deadline:
            time.sleep(0.005)
        assert polled[0] == {"high": 1, "normal": 0}  # heard from a step's write
        r.delete(keys.queue(MODEL, "high"))
        time.sleep(4 * POLL_S)
        assert all(w is not None for w in polled)  # steps came: it never read the lanes

        stepping.clear()  # a long prefill: no step written
        stepper.join(5)
        heard = len(polled)
        time.sleep(10 * POLL_S)
        own_reads = polled[heard:]
        assert own_reads and all(w is None for w in own_reads)  # it reads them itself
        assert len(own_reads) <= 12  # about once per preempt_poll_s
    finally:
        stepping.clear()
        preemptor.stop()
        publisher.stop()
