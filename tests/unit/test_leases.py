"""A lost lease aborts its attempt in the engine, but never the newer attempt of the same
job that this worker took meanwhile (the engine cancels by job)."""

from __future__ import annotations

from unittest.mock import MagicMock

from tokenq.workers.leases import Leases
from tokenq.workers.publisher import Publisher


def test_a_fenced_attempt_does_not_cancel_the_newer_one() -> None:
    publisher = Publisher(MagicMock())
    old = publisher.track("job_1", 1)
    store, engine = MagicMock(), MagicMock()
    leases = Leases(store, publisher, engine, "w1")
    store.renew.side_effect = lambda *_: (
        publisher.track("job_1", 2), [False])[1]  # taken again while the renew was in flight
    leases.renew()
    assert old.outcome == "fenced"
    engine.cancel.assert_not_called()
    store.renew.side_effect = lambda *_: [False]  # the newest attempt lost: cancel
    leases.renew()
    engine.cancel.assert_called_once_with("job_1")


def test_the_fenced_attempt_ending_leaves_the_newer_one_followed() -> None:
    publisher = Publisher(MagicMock())
    publisher.track("job_1", 1)
    newer = publisher.track("job_1", 2)
    publisher.untrack("job_1", 1)  # the fenced attempt's task thread ends
    assert publisher.current("job_1") is newer
    publisher.untrack("job_1", 2)
    assert publisher.current("job_1") is None
