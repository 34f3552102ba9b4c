"""shared/aio.py: a task whose cancellation is lost still ends. The loss is Python 3.11's
own: `asyncio.wait_for` returns the wrapped call's result when the cancellation lands as
that call finishes (redis-py's socket writes run in wait_for)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tokenq.shared import aio

DEADLINE_S = 5.0


async def _victim(inner: asyncio.Future[int], ran_on: asyncio.Event) -> None:
    await asyncio.wait_for(inner, 10)
    ran_on.set()  # reached only where the cancellation was lost
    await asyncio.sleep(3600)


def _cancel_as_it_finishes(cancel: str) -> bool:
    """Cancel a task in wait_for just as its inner call finishes, with a plain cancel
    ("once") or with `cancel_and_wait`; True when the task ran on past the cancel."""
    async def main() -> bool:
        inner: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        ran_on = asyncio.Event()
        task = asyncio.create_task(_victim(inner, ran_on))
        await asyncio.sleep(0)  # the task waits in wait_for
        inner.set_result(1)
        if cancel == "once":
            task.cancel()
            await asyncio.wait({task}, timeout=0.5)
            lost = not task.done()
            task.cancel()
        else:
            await asyncio.wait_for(aio.cancel_and_wait(task, again_s=0.05), DEADLINE_S)
            lost = ran_on.is_set()
        assert task.done() or cancel == "once"
        return lost
    return asyncio.run(main())


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12's wait_for keeps it")
def test_python_311_wait_for_loses_a_cancellation() -> None:
    assert _cancel_as_it_finishes("once")


def test_cancel_and_wait_ends_a_task_whose_cancellation_was_lost() -> None:
    _cancel_as_it_finishes("cancel_and_wait")  # (within the deadline, else TimeoutError)


def test_cancel_and_wait_leaves_done_tasks_and_reraises_its_own_cancellation() -> None:
    async def main() -> None:
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        await aio.cancel_and_wait(done)
        assert not done.cancelled()

        give_up = asyncio.Event()
        ignored: list[int] = []

        async def stubborn() -> None:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if give_up.is_set():
                        raise
                    ignored.append(1)

        task = asyncio.create_task(stubborn())
        waiter = asyncio.create_task(aio.cancel_and_wait(task, again_s=0.05))
        async with asyncio.timeout(DEADLINE_S):  # cancelled again, and again
            while len(ignored) < 2:
                await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not task.done()
        give_up.set()
        await asyncio.wait_for(aio.cancel_and_wait(task), DEADLINE_S)
    asyncio.run(main())


async def _loses_one_cancel(ended: list[str]) -> None:
    """A loop told to stop that does not notice, and loses its first cancellation."""
    lost = False
    try:
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost = True
    finally:
        ended.append("ended")


@pytest.mark.parametrize("how", ["stop", "wait_for"])
def test_stop_ends_a_task_that_lost_its_cancellation(how: str) -> None:
    """The lifespan's shutdown used `wait_for(task, 5)`, which waits for the cancelled task
    to end: forever, for one whose cancellation was lost."""
    async def main() -> bool:
        ended: list[str] = []
        task = asyncio.create_task(_loses_one_cancel(ended))
        try:
            if how == "stop":
                await asyncio.wait_for(aio.stop(task, 0.1), DEADLINE_S)
            else:
                await asyncio.wait_for(asyncio.wait_for(task, 0.1), 1.0)
        except TimeoutError:
            pass
        done = task.done()
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return done and bool(ended)
    assert asyncio.run(main()) == (how == "stop")


def test_stop_leaves_a_task_that_ends_in_its_grace() -> None:
    async def main() -> None:
        stopped = asyncio.Event()

        async def polite() -> str:
            await stopped.wait()
            return "done"

        task = asyncio.create_task(polite())
        asyncio.get_running_loop().call_later(0.05, stopped.set)
        await asyncio.wait_for(aio.stop(task, DEADLINE_S), DEADLINE_S)
        assert task.result() == "done"
    asyncio.run(main())
