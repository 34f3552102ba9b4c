"""`tokenq bench scale`'s SSE client as an instrument: its own garbage collector is off
while it measures (a pause of it was counted as the server's latency), and the steady
p99 leaves out the run's synthetic first and last second."""

from __future__ import annotations

import gc

import pytest

from tokenq.cli.bench.scale_load import collector_off
from tokenq.cli.bench.scale_sse import Fanout, steady


def test_the_collector_is_off_while_measuring_and_back_after() -> None:
    assert gc.isenabled()
    with collector_off():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what start-up built is out of the collector's way
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_comes_back_when_the_measurement_fails() -> None:
    with pytest.raises(RuntimeError), collector_off():
        raise RuntimeError("a stream broke")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_steady_latencies_leave_out_the_first_and_last_second() -> None:
    f = Fanout()
    for i in range(101):  # one token every 0.1 s for 10 s; the edges slow
        t = 100.0 + i / 10
        f.received.append(t)
        f.latencies.append(0.5 if t < 101.0 or t > 109.0 else 0.01)
    f.last_token = f.received[-1]
    got = steady(f)
    assert got and set(got) == {0.01}
    assert len(got) == 81  # 101.0 .. 109.0 inclusive
    assert steady(Fanout()) == []
