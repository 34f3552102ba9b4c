"""With durable_replicas, a job's ending reaches a client only once a replica has it: a
`done` (or a terminal record) read an instant before the primary dies cannot be taken back
by the failover (the promoted replica would run the job again, and a sampled job would end
with other text than the client was shown)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.faults.harness import FAKE
from tests.faults.sentinel_deploy import SentinelDeployment, sentinel_deployment
from tests.faults.test_sentinel import models_file
from tokenq.api.app import create_app
from tokenq.shared import keys
from tokenq.shared.jobs import Acquired, Ending, dumps
from tokenq.shared.settings_roles import ApiSettings
from tokenq.shared.store import JobStore


@pytest.fixture
def dep(tmp_path: Path) -> Iterator[SentinelDeployment]:
    with sentinel_deployment(tmp_path / "redis") as d:
        yield d


@pytest.mark.parametrize("read", ["record", "stream"])
def test_an_ending_is_passed_on_only_once_a_replica_has_it(
        read: str, dep: SentinelDeployment, tmp_path: Path) -> None:
    # A generous WAIT: the check is the order of events, not a duration.
    settings = dep.settings(state_dir=tmp_path, models_file=models_file(tmp_path),
                            served_models=[FAKE],
                            api=ApiSettings(durable_replicas=1, durable_timeout_ms=20_000))
    primary = dep.client_of(dep.primary)
    replica = dep.client_of(dep.replica)
    store = JobStore(primary, settings)
    assert dep.replica.proc is not None
    with TestClient(create_app(settings)) as client:
        # No worker serves FAKE here: the test ends the job itself, as a worker would.
        resp = client.post("/v1/jobs", json={"model": FAKE, "prompt": "go", "max_tokens": 2})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
        got = store.acquire(job_id, "w-test")
        assert isinstance(got, Acquired)
        os.kill(dep.replica.proc.pid, signal.SIGSTOP)  # the replica stops acknowledging
        try:
            assert store.finish(Ending(job_id, got.attempt, "succeeded",
                                       {"finished_at": repr(time.time()), "output": ""},
                                       "done", dumps({"finish_reason": "stop"})))
            seen: list[float] = []

            def reader() -> None:
                if read == "record":
                    rec = client.get(f"/v1/jobs/{job_id}").json()
                    assert rec["status"] == "succeeded", rec
                else:
                    with client.stream("GET", f"/v1/jobs/{job_id}/events") as s:
                        body = "".join(s.iter_text())
                    assert "event: done" in body, body
                seen.append(time.monotonic())

            t = threading.Thread(target=reader, daemon=True)
            t.start()
            t.join(1.0)  # the replica is stopped: the ending must not be passed on yet
            assert not seen, "the ending reached the client before any replica had it"
        finally:
            os.kill(dep.replica.proc.pid, signal.SIGCONT)
        resumed = time.monotonic()
        t.join(60)
        assert seen and seen[0] >= resumed
        assert replica.hget(keys.job(job_id), "state") == "succeeded"
    primary.close()
    replica.close()
