"""The worker's adapter watcher on a real Redis: a registry change reaches it through the
change stream at once, even one written between its read of the registry and its first
wait on the stream; with nothing changing it does not re-read the registry on every wait
(the re-read every `adapter_poll_s` is a safety net, not the way changes arrive)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from tokenq.shared import keys
from tokenq.shared.lora_registry import AdapterRecord, AdapterRef, AdapterVersion
from tokenq.shared.settings import Settings
from tokenq.workers.lora_watcher import AdapterWatcher

MODEL = "m"


class Engine:
    """The two calls the watcher makes, recorded."""

    def __init__(self) -> None:
        self.loaded: list[int] = []

    def load_adapter(self, ref: AdapterRef) -> int | None:
        self.loaded.append(ref.id)
        return None

    def unload_adapter(self, ref: AdapterRef) -> None:
        pass


def record(version: int) -> str:
    """Adapter `a` with versions 1..`version`, the last one served."""
    return AdapterRecord(name="a", base=MODEL, engine="fake", status="loaded", current=version,
                         versions=[AdapterVersion(id=v, path=f"/a{v}", created_at=0.0)
                                   for v in range(1, version + 1)]).model_dump_json()


def publish(r: redis.Redis, version: int) -> None:
    """What the API's admin route writes: the record and its change entry, in one
    transaction."""
    pipe = r.pipeline(transaction=True)
    pipe.hset(keys.ADAPTERS, "a", record(version))
    pipe.xadd(keys.ADAPTER_EVENTS, {"name": "a"}, maxlen=1000, approximate=True)
    pipe.execute()


def until(cond: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.fixture
def stopping() -> Iterator[list[AdapterWatcher]]:
    started: list[AdapterWatcher] = []
    yield started
    for w in started:
        w.stop()


def test_a_change_after_the_registry_read_is_served_at_once(
        r: redis.Redis, stopping: list[AdapterWatcher]) -> None:
    publish(r, 1)
    engine = Engine()
    # a re-read far away: only the change stream can bring version 2 in time
    w = AdapterWatcher(r, engine, MODEL, "w1", poll_s=60.0)  # type: ignore[arg-type]
    stopping.append(w)
    w.read_all()
    assert engine.loaded == [1]
    publish(r, 2)  # before the watcher's first wait on the stream
    w._thread.start()
    assert until(lambda: engine.loaded == [1, 2], 5.0), engine.loaded
    publish(r, 3)  # and while it waits
    assert until(lambda: engine.loaded == [1, 2, 3], 5.0), engine.loaded


def test_an_idle_watcher_does_not_read_the_registry_each_wait(
        r: redis.Redis, stopping: list[AdapterWatcher]) -> None:
    publish(r, 1)
    engine = Engine()
    w = AdapterWatcher(r, engine, MODEL, "w1", Settings().adapter_poll_s)  # type: ignore[arg-type]
    stopping.append(w)
    reads: list[float] = []
    sync, lock = w.sync, threading.Lock()

    def counted() -> None:
        with lock:
            reads.append(time.monotonic())
        sync()

    w.sync = counted  # type: ignore[method-assign]
    w.start()
    time.sleep(0.2)  # the start's own read is done
    before = len(reads)
    window_s = 2.0
    time.sleep(window_s)
    assert len(reads) - before <= 1, f"{len(reads) - before} registry reads in {window_s} s"
    publish(r, 2)  # a change still comes in at once
    assert until(lambda: engine.loaded == [1, 2], 5.0), engine.loaded


def test_after_a_redis_error_the_registry_is_read_again_soon(
        r: redis.Redis, stopping: list[AdapterWatcher]) -> None:
    """A failover can lose the change entry of a write the registry kept: after a failed
    read the watcher reads the whole registry again within seconds, not at the next
    safety-net poll."""
    publish(r, 1)
    engine = Engine()
    w = AdapterWatcher(r, engine, MODEL, "w1", poll_s=60.0)  # type: ignore[arg-type]
    stopping.append(w)
    w.read_all()
    failed: list[bool] = []
    xread = w.r.xread

    def flaky(*args: object, **kwargs: object) -> object:
        if not failed:
            failed.append(True)
            r.hset(keys.ADAPTERS, "a", record(2))  # the write lands; its entry is lost
            raise redis.ConnectionError("primary gone")
        return xread(*args, **kwargs)  # type: ignore[arg-type]

    w.r = type("Flaky", (), {"xread": staticmethod(flaky), "xrevrange": r.xrevrange,
                             "hgetall": r.hgetall, "hset": r.hset})()  # type: ignore[assignment]
    w._thread.start()
    assert until(lambda: engine.loaded == [1, 2], 10.0), engine.loaded
