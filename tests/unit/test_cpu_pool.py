"""The API's CPU pool (api/cpu.py): a tenant holds at most its share of the threads, its
excess waits (up to its queue, then a 429), a freed thread goes to the tenant holding the
fewest, and a caller that goes away gives its thread back only when the work ends."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tokenq.api.cpu import PATIENT, CpuPool, sizes
from tokenq.api.errors import RateLimited
from tokenq.shared.settings_roles import ApiSettings


class Gate:
    """Work that holds its thread until released, and says who ran, in order."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.ran: list[str] = []
        self.started = threading.Semaphore(0)
        self.one: dict[str, threading.Event] = {}

    def work(self, who: str) -> str:
        self.ran.append(who)
        self.started.release()
        mine = self.one.setdefault(who, threading.Event())
        deadline = time.monotonic() + 10
        while not (self.open.is_set() or mine.is_set()):
            assert time.monotonic() < deadline
            self.open.wait(0.005)
        return who

    def release(self, who: str) -> None:
        """Let `who` alone finish."""
        self.one.setdefault(who, threading.Event()).set()


async def until(cond: object, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_a_tenant_holds_its_share_and_the_other_gets_the_rest() -> None:
    async def scenario() -> None:
        pool = CpuPool(threads=2, per_tenant=1, queue=8)
        gate = Gate()
        a = [asyncio.create_task(pool.run("a", gate.work, f"a{i}")) for i in range(5)]
        # `running` counts a call when it takes its thread; the work starts a moment later
        await until(lambda: pool.running("a") == 1 and pool.waiting("a") == 4
                    and gate.ran == ["a0"])
        b = asyncio.create_task(pool.run("b", gate.work, "b0"))
        await until(lambda: pool.running("b") == 1)  # straight in: a's excess waits
        await until(lambda: len(gate.ran) == 2)
        assert gate.ran == ["a0", "b0"]
        gate.open.set()
        assert await asyncio.gather(*a, b) == ["a0", "a1", "a2", "a3", "a4", "b0"]
        assert pool.running("a") == pool.running("b") == 0
        pool.close()

    asyncio.run(scenario())


def test_the_fewest_holding_tenant_goes_first() -> None:
    async def scenario() -> None:
        pool = CpuPool(threads=2, per_tenant=2, queue=8)
        gate = Gate()
        a = [asyncio.create_task(pool.run("a", gate.work, f"a{i}")) for i in range(4)]
        await until(lambda: pool.running("a") == 2 and pool.waiting("a") == 2
                    and len(gate.ran) == 2)
        b = asyncio.create_task(pool.run("b", gate.work, "b0"))
        await until(lambda: pool.waiting("b") == 1)
        gate.release("a0")  # one thread comes free: b gets it, not a's next waiting call
        await until(lambda: len(gate.ran) == 3)
        gate.open.set()
        await asyncio.gather(*a, b)
        # b waited behind a's two running calls, not behind a's two waiting ones
        assert gate.ran.index("b0") == 2, gate.ran
        pool.close()

    asyncio.run(scenario())


def test_beyond_the_queue_is_429_unless_patient() -> None:
    async def scenario() -> None:
        pool = CpuPool(threads=2, per_tenant=1, queue=2)
        gate = Gate()
        held = [asyncio.create_task(pool.run("a", gate.work, f"a{i}")) for i in range(3)]
        await until(lambda: pool.waiting("a") == 2)
        with pytest.raises(RateLimited) as got:
            await pool.run("a", gate.work, "refused")
        assert got.value.status == 429 and got.value.code == "cpu_busy"
        async def as_the_batch_driver() -> str:
            PATIENT.set(True)  # this task's context only
            return await pool.run("a", gate.work, "batch")

        patient = asyncio.create_task(as_the_batch_driver())
        await until(lambda: pool.waiting("a") == 3)
        gate.open.set()
        assert await asyncio.gather(*held, patient) == ["a0", "a1", "a2", "batch"]
        assert "refused" not in gate.ran
        pool.close()

    asyncio.run(scenario())


def test_a_cancelled_caller_keeps_its_thread_until_the_work_ends() -> None:
    async def scenario() -> None:
        pool = CpuPool(threads=1, per_tenant=1, queue=4)
        gate = Gate()
        first = asyncio.create_task(pool.run("a", gate.work, "a0"))
        await until(lambda: pool.running("a") == 1)
        waiting = asyncio.create_task(pool.run("a", gate.work, "gone"))
        await until(lambda: pool.waiting("a") == 1)
        waiting.cancel()  # went away while waiting: never runs
        first.cancel()  # went away while running: the thread is still busy
        await asyncio.gather(first, waiting, return_exceptions=True)
        assert pool.waiting("a") == 0 and pool.running("a") == 1
        gate.open.set()
        await until(lambda: pool.running("a") == 0)
        assert await pool.run("a", gate.work, "a1") == "a1"
        assert gate.ran == ["a0", "a1"]
        pool.close()

    asyncio.run(scenario())


def test_errors_reach_the_caller_and_free_the_thread() -> None:
    def boom() -> None:
        raise ValueError("bad template")

    async def scenario() -> None:
        pool = CpuPool(threads=1, per_tenant=1, queue=0)
        with pytest.raises(ValueError, match="bad template"):
            await pool.run("a", boom)
        await until(lambda: pool.running("a") == 0)
        assert await pool.run("a", len, "abc") == 3
        pool.close()

    asyncio.run(scenario())


def test_sizes_from_the_settings() -> None:
    assert sizes(ApiSettings(cpu_threads=6, cpu_tenant_threads=0)) == (6, 3)
    assert sizes(ApiSettings(cpu_threads=2, cpu_tenant_threads=5)) == (2, 2)
    threads, share = sizes(ApiSettings())
    assert 1 <= threads <= 4 and share == max(1, threads // 2)
