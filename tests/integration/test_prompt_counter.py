"""The API loads the served models' vocabularies at start-up, not on the first request."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from tests.conftest import GEMMA, SMOL
from tokenq.api.app import create_app
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings


def test_vocabularies_load_at_startup_without_a_request(
        redis_server: EmbeddedRedis, stack_settings: Settings) -> None:
    settings = stack_settings.model_copy(update={
        "redis_url": redis_server.url.rsplit("/", 1)[0] + "/14",  # away from the stack's db
        "served_models": [SMOL, GEMMA]})
    app = create_app(settings)
    with TestClient(app) as client:
        counter = app.state.tokenq.counter
        deadline = time.monotonic() + 30
        while counter.loaded() != {SMOL: True, GEMMA: True}:
            assert time.monotonic() < deadline, counter.loaded()
            time.sleep(0.05)
        # The first request finds it loaded: a prompt over the context is counted exactly.
        resp = client.post("/v1/jobs", json={"model": GEMMA, "prompt": "call " * 20_000,
                                             "max_tokens": 8})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "context_length_exceeded"
