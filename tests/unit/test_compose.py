"""compose/: no Docker engine runs here, so the compose file is checked by parsing it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_wires_redis_api_worker() -> None:
    doc = yaml.safe_load((ROOT / "compose" / "compose.yml").read_text())
    services = doc["services"]
    assert {"redis", "api", "cpu-worker"} <= set(services)
    assert "--requirepass" in services["redis"]["command"]
    assert "--appendonly" in services["redis"]["command"]
    for name in ("api", "cpu-worker"):
        env = services[name]["environment"]
        assert env["TOKENQ_ENV"] == "production" and "@redis:6379" in env["TOKENQ_REDIS_URL"]
    assert services["cpu-worker"]["command"][:2] == ["tokenq", "worker"]
    run_lines = [ln for ln in (ROOT / "compose" / "Dockerfile").read_text().splitlines()
                 if ln.startswith("RUN")]
    assert any("scripts/setup.sh" in ln for ln in run_lines)  # builds as the README installs
