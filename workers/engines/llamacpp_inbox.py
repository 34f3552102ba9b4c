"""The llama.cpp engine's inbox: what other threads send its loop, and the preemption hold.

Any thread puts a message (submit, cancel, hold, adapter load/unload, stop); the engine
thread drains them all at each step's start. A hold (workers/preempt.py) says a slot is
being freed for a job on its way: the loop then starts no step until a submit arrives or
the hold ends, so that job joins the very next step.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

Message = tuple[str, Any]


class Inbox:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._arrived = threading.Event()  # a submit since the last drain
        self.held = 0  # slots freed for jobs on their way
        self._until = 0.0

    def put(self, kind: str, arg: Any = None) -> None:
        self._q.put((kind, arg))
        if kind == "submit":
            self._arrived.set()

    def drain(self, block: bool) -> list[Message]:
        """Every message waiting (with `block`, the first within 0.5 s, if any)."""
        self._arrived.clear()
        msgs: list[Message] = []
        try:
            msgs.append(self._q.get(timeout=0.5) if block else self._q.get_nowait())
            while True:
                msgs.append(self._q.get_nowait())
        except queue.Empty:
            pass
        for kind, arg in msgs:
            if kind == "submit":
                self.held = max(0, self.held - 1)
            elif kind == "hold":
                self.held += 1
                self._until = time.monotonic() + float(arg)
        return msgs

    def await_held(self) -> None:
        """Wait for a submit until the hold ends; once it has ended, no slot is held."""
        left = self._until - time.monotonic()
        if left <= 0 or not self._arrived.wait(left):
            self.held = 0
