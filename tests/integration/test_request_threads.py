"""A request's dependencies (the app state, the caller's key, its tenant, its role) run on
the event loop: FastAPI hands a plain `def` dependency to a worker thread, a hop per
dependency per request that, on a machine whose cores the engine keeps busy, waits for the
thread to be scheduled."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.integration.inproc import fake_settings
from tokenq.api.app import create_app
from tokenq.shared.redis_server import EmbeddedRedis

MODEL = "fake-threads"
pytestmark = pytest.mark.usefixtures("r")  # db 15, flushed


def test_no_request_hands_its_dependencies_to_a_thread(
        redis_server: EmbeddedRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastapi.dependencies.utils as dep_utils
    import fastapi.routing as routing

    hops: Counter[str] = Counter()

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        async def run(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            hops[getattr(func, "__name__", repr(func))] += 1
            return await real(func, *args, **kwargs)
        return run

    for module in (dep_utils, routing):
        monkeypatch.setattr(module, "run_in_threadpool", counting(module.run_in_threadpool))
    app = create_app(fake_settings(redis_server, tmp_path, [MODEL]),
                     api_keys="adm:ops:admin,usr:acme")
    user, admin = {"Authorization": "Bearer usr"}, {"Authorization": "Bearer adm"}
    with TestClient(app) as c:
        job = c.post("/v1/jobs", headers=user, json={"model": MODEL, "prompt": "hi",
                                                     "max_tokens": 4})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        assert c.get(f"/v1/jobs/{job_id}", headers=user).status_code == 200
        assert c.delete(f"/v1/jobs/{job_id}", headers=user).status_code == 200
        with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=user) as events:
            assert events.status_code == 200
            assert "event: cancelled" in events.read().decode()
        assert c.get("/v1/models", headers=user).status_code == 200
        assert c.get("/v1/admin/workers", headers=admin).status_code == 200
        assert c.get("/v1/admin/workers", headers=user).status_code == 403
        assert c.get("/metrics/targets", headers=admin).status_code == 200
    assert not hops, f"handed to a worker thread: {dict(hops)}"
