"""CPU work a request asks of the API, off the event loop and shared fairly between tenants.

Rendering a chat template, tokenizing a long prompt, detokenizing, parsing a long batch
line: each can take the better part of a second on a 1 MB body, and on the event loop it
would stall every other tenant's streams and POSTs meanwhile. `CpuPool` runs such work on
a few threads. A tenant holds at most `per_tenant` of them at once; its next requests wait
(at most `queue` of them; beyond that, a 429), and a freed thread goes to the waiting
tenant that holds the fewest, so one tenant's flood never keeps another's request behind
it. llama.cpp's and Hugging Face's tokenizers release the GIL while they work; the Python
parts (a template, a token list) hold it in slices of the interpreter's switch interval,
and a long copy or JSON encoding is cut in slices by its caller. One long C call (json.loads
of a 1 MB line of 30,000 messages, its pydantic validation) still holds the GIL whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import TypeVar

from tokenq.api.errors import RateLimited
from tokenq.shared.settings_roles import ApiSettings

T = TypeVar("T")

# Set in a task that waits for its turn however long the tenant's queue is: the batch
# driver, which works through lines of that tenant's, has nobody to answer a 429 to.
PATIENT: ContextVar[bool] = ContextVar("tokenq_cpu_patient", default=False)

MAX_DEFAULT_THREADS = 4
# The pool's threads run this much nicer than the loop's (Linux: nice is per thread), so
# where cores are short the loop that serves every tenant is scheduled first.
NICE = 10
# A thread that takes the GIL while the loop waits on a socket keeps it until the switch
# interval has passed (5 ms by default), and a request waits on several sockets: beside a
# busy pool a POST's round trips to Redis reached a p99 of 18-36 ms, 7-13 ms at 1 ms.
SWITCH_S = 0.001


def _nicer() -> None:
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me)
                                                    + NICE))


def sizes(api: ApiSettings) -> tuple[int, int]:
    """(threads, one tenant's share of them) from the settings; 0 picks them from the cores
    this process may run on: up to 4 threads, half of them a tenant's."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    threads = api.cpu_threads or max(1, min(MAX_DEFAULT_THREADS, cores))
    share = api.cpu_tenant_threads or max(1, threads // 2)
    return threads, min(share, threads)


class CpuPool:
    def __init__(self, threads: int, per_tenant: int, queue: int):
        self.threads, self.per_tenant, self.queue = threads, min(per_tenant, threads), queue
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_S))  # the whole process
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenq-cpu",
                                            initializer=_nicer)
        self._free = threads
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._order = itertools.count()

    @classmethod
    def from_settings(cls, api: ApiSettings) -> CpuPool:
        threads, share = sizes(api)
        return cls(threads, share, api.cpu_tenant_queue)

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def waiting(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))

    async def run(self, tenant: str, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on a thread within `tenant`'s share. A call beyond `queue` waiting
        ones is refused with a 429, unless its task is PATIENT (the batch driver's)."""
        await self._acquire(tenant, PATIENT.get())
        loop = asyncio.get_running_loop()
        try:
            done: Future[T] = self._executor.submit(fn, *args)
        except BaseException:
            self._release(tenant)
            raise
        # The thread is given back when the work ends, not when the caller stops waiting:
        # a client that hangs up cannot leave its work running outside its share.
        done.add_done_callback(lambda _: self._release_from_thread(loop, tenant))
        return await asyncio.wrap_future(done)

    def _release_from_thread(self, loop: asyncio.AbstractEventLoop, tenant: str) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is left to wake
            loop.call_soon_threadsafe(self._release, tenant)

    async def _acquire(self, tenant: str, patient: bool) -> None:
        if self._free > 0 and self.running(tenant) < self.per_tenant \
                and not self._waiting.get(tenant):
            self._take(tenant)
            return
        if not patient and self.waiting(tenant) >= self.queue:
            raise RateLimited(f"{self.running(tenant)} of your tokenize/render requests run "
                              f"and {self.waiting(tenant)} wait, the limit per tenant; retry "
                              "shortly", retry_after=1, code="cpu_busy")
        queue = self._waiting.setdefault(tenant, deque())
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._order), turn)
        queue.append(entry)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(tenant)  # granted just as the caller went away
            elif entry in queue:
                queue.remove(entry)
                if not queue and self._waiting.get(tenant) is queue:
                    del self._waiting[tenant]
            raise

    def _take(self, tenant: str) -> None:
        self._free -= 1
        self._running[tenant] = self.running(tenant) + 1

    def _release(self, tenant: str) -> None:
        self._free += 1
        left = self.running(tenant) - 1
        if left:
            self._running[tenant] = left
        else:
            self._running.pop(tenant, None)
        self._dispatch()

    def _dispatch(self) -> None:
        """Free threads to waiting tenants under their share: the one holding the fewest
        first, then the longest waiting."""
        while self._free > 0:
            ready = [(self.running(t), q[0][0], t) for t, q in self._waiting.items()
                     if q and self.running(t) < self.per_tenant]
            if not ready:
                return
            _, _, tenant = min(ready)
            queue = self._waiting[tenant]
            _, turn = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            if turn.done():  # its caller was cancelled and has not run its cleanup yet
                continue
            self._take(tenant)
            turn.set_result(None)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
