"""An API in-process (TestClient) on the fake engine's models and the tests' db 15 (the
`r` fixture flushes it), for tests of the API alone: no worker, no model loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import ApiSettings


def fake_settings(redis_server: EmbeddedRedis, tmp: Path, models: list[str],
                  **api: Any) -> Settings:
    models_file = tmp / "models.json"
    models_file.write_text(json.dumps({m: {"backend": "fake"} for m in models}))
    return Settings(redis_url=redis_server.url.rsplit("/", 1)[0] + "/15", state_dir=tmp,
                    models_file=models_file, served_models=models,
                    api=ApiSettings(**api))
