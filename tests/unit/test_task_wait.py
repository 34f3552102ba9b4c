"""A task thread waits for its job without polling: it sleeps until its handle is nudged
(the job ended, its lease was lost, the engine died), not 4 times a second per slot."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from tokenq.shared.settings import Settings
from tokenq.workers import tasks
from tokenq.workers.leases import Leases
from tokenq.workers.publisher import JobHandle, Publisher


class Engine:
    def __init__(self) -> None:
        self.alive = True
        self.looks = 0
        self.cancel = mock.Mock()

    def healthy(self) -> bool:
        self.looks += 1
        return self.alive


def start_wait(publisher: Publisher, engine: Engine) -> tuple[JobHandle, dict[str, Any],
                                                             threading.Thread]:
    rt = SimpleNamespace(engine=engine, drainer=mock.Mock(), engine_dead=threading.Event())
    handle = publisher.track("j1", 1)
    out: dict[str, Any] = {"rt": rt}

    def run() -> None:
        out["outcome"] = tasks.wait(rt, "j1", 1, handle)  # type: ignore[arg-type]
        out["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return handle, out, t


def test_a_waiting_task_thread_does_not_poll_and_wakes_when_its_job_ends() -> None:
    publisher, engine = Publisher(mock.Mock()), Engine()
    handle, out, t = start_wait(publisher, engine)
    time.sleep(1.0)  # the old loop looked at the engine every 0.25 s: 4 looks by now
    assert engine.looks == 0 and t.is_alive()
    handle.finish("succeeded")
    t.join(timeout=3)
    assert out["outcome"] == "succeeded"


def test_an_engine_that_died_wakes_every_waiting_thread_to_hand_its_job_back() -> None:
    publisher, engine = Publisher(mock.Mock()), Engine()
    _, out, t = start_wait(publisher, engine)
    engine.alive = False
    woke = time.monotonic()
    publisher.wake_all()  # what the worker does when its heartbeat finds the engine dead
    t.join(timeout=tasks.WATCHDOG_S / 2)
    assert out.get("outcome") == "handed_back", "not woken by the nudge"
    assert out["at"] - woke < tasks.WATCHDOG_S / 2
    out["rt"].drainer.hand_back.assert_called_once_with("j1", 1)


def test_a_lost_lease_wakes_its_task_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "FENCED_LET_GO_S", 0.1)  # the engine never lets go here
    publisher, engine = Publisher(mock.Mock()), Engine()
    _, out, t = start_wait(publisher, engine)
    store = mock.Mock()
    store.renew.return_value = [False]
    Leases(store, publisher, engine, "w1").renew()  # type: ignore[arg-type]
    t.join(timeout=tasks.WATCHDOG_S / 2)
    assert out.get("outcome") == "fenced", "not woken by the lost lease"
    engine.cancel.assert_called_once_with("j1")


def test_the_worker_wakes_its_task_threads_when_its_engine_dies(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenq.workers import runtime

    kill = mock.Mock()
    monkeypatch.setattr("os.kill", kill)  # the warm shutdown it starts
    publisher = mock.Mock()
    heartbeat = mock.Mock()
    heartbeat.stalled_grammars.return_value = []
    rt = SimpleNamespace(engine_dead=threading.Event(), publisher=publisher,
                         heartbeat=heartbeat, worker_id="w1",
                         engine=SimpleNamespace(backend="llamacpp"))
    runtime.WorkerRuntime._engine_died(rt)  # type: ignore[arg-type]
    publisher.wake_all.assert_called_once_with()
    kill.assert_called_once()


def test_an_engine_stalled_in_a_grammar_hands_jobs_back_and_marks_the_job_poison(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's thread is alive (healthy() says so) but stuck in llama.cpp's grammar:
    the heartbeat's look finds the job whose grammar ran past `grammar_stall_s`, the worker
    marks it (its next acquire fails it as poison) and the task threads hand their jobs
    back though healthy() is still true."""
    from tokenq.workers import runtime
    from tokenq.workers.heartbeat import Heartbeat

    monkeypatch.setattr("os.kill", mock.Mock())
    now = time.monotonic()

    class Stuck(Engine):
        backend = "llama"

        def grammar_busy(self) -> list[tuple[str, int, float]]:
            return [("poison", 2, now - 61.0), ("fresh", 1, now - 1.0)]

    engine = Stuck()
    hb = SimpleNamespace(settings=Settings(), engine=engine)
    stalled = Heartbeat.stalled_grammars(hb)  # type: ignore[arg-type]
    assert stalled == [("poison", 2)]  # over the default 60 s; the other is not
    publisher = Publisher(mock.Mock())
    _, out, t = start_wait(publisher, engine)
    store = mock.Mock()
    rt = SimpleNamespace(engine_dead=out["rt"].engine_dead, publisher=publisher,
                         heartbeat=mock.Mock(**{"stalled_grammars.return_value": stalled}),
                         worker_id="w1", engine=engine, store=store, settings=Settings())
    runtime.WorkerRuntime._engine_died(rt)  # type: ignore[arg-type]
    store.mark_grammar.assert_called_once_with("poison", 2)
    t.join(timeout=tasks.WATCHDOG_S / 2)
    assert engine.alive and out.get("outcome") == "handed_back"
