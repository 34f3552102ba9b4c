"""Brings compose/compose.yml up on Docker for each test module (`make test-cluster` builds
the images first): the main deployment for test_scenarios.py, profile `ha` for test_ha.py,
one at a time; each is taken down at the end of its module, whatever happened."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cluster.ha import HA_ENV, HA_PROJECT, HA_SERVICES
from tests.cluster.harness import ROOT, Cluster, wait_for
from tokenq.shared.redis_server import free_port

# Debian-built images where the compose file names registry ones (no registry here).
BASE = os.environ.get("TOKENQ_BASE_IMAGE", "tokenq/debian-base:bookworm")
SERVICES = ["redis", "api", "lb", "cpu-worker", "autoscaler", "prometheus"]
COUNTS = {"api": 2, "cpu-worker": 2}
TENANTS = ["tenant-a", "tenant-b"]


def make_secrets(folder: Path) -> dict[str, str]:
    """scripts/compose_secrets.sh, as an operator runs it; returns tenant -> key."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "compose_secrets.sh"), *TENANTS], check=True,
        capture_output=True, text=True,
        env={**os.environ, "TOKENQ_SECRETS_DIR": str(folder),
             "TOKENQ_ENV_FILE": str(folder / "env")}).stdout
    return dict(line.split() for line in out.splitlines())


def require_images() -> None:
    for image in (BASE, "tokenq:latest"):
        if subprocess.run(["docker", "image", "inspect", image],
                          capture_output=True).returncode != 0:
            pytest.fail(f"image {image} is missing: run `make test-cluster` (it builds them)")


def base_env(folder: Path) -> dict[str, str]:
    return {
        "REDIS_PASSWORD": secrets.token_urlsafe(16), "GRAFANA_PASSWORD": "unused",
        "TOKENQ_SECRETS_DIR": str(folder), "TOKENQ_IMAGE": "tokenq:latest",
        "TOKENQ_BASE_IMAGE": BASE, "REDIS_IMAGE": BASE, "PROMETHEUS_IMAGE": BASE,
        "NGINX_IMAGE": BASE, "API_BIND": "127.0.0.1", "API_PORT": str(free_port()),
        "PROMETHEUS_BIND": "127.0.0.1",
        # Short leases and windows so that each fault plays out in seconds.
        "TOKENQ_WORKER__LEASE_TTL_S": "5", "TOKENQ_WORKER__HEARTBEAT_S": "1",
        "TOKENQ_WORKER__RECONCILE_S": "1",
        "TOKENQ_WORKER_TTL_S": "5", "AUTOSCALE_MAX": "2", "TOKENQ_API__SSE_PING_S": "3",
        "TOKENQ_AUTOSCALE__DOWN_WINDOW_S": "10", "TOKENQ_AUTOSCALE__COOLDOWN_S": "10",
        # The scenarios poll and burst from one tenant; rate limits are tested elsewhere
        # (tests/faults/test_backpressure.py).
        "TOKENQ_API__RATE_LIMIT_RPS": "0",
    }


@contextmanager
def running(c: Cluster, services: list[str], counts: dict[str, int],
            folder: Path) -> Iterator[Cluster]:
    """Up from scratch, healthy, two fixed workers heartbeating; down with its volumes at
    the end, whatever happened (the last logs kept in `folder`)."""
    c.compose("down", "-v", "--remove-orphans", timeout=180)
    try:
        c.compose("up", "-d", "--no-build", *(f"--scale={s}={n}" for s, n in counts.items()),
                  *services, timeout=600)
        c.wait_healthy(services, counts, timeout=300)
        wait_for("two fixed workers heartbeating", lambda: len(c.fixed_workers()) == 2, 120)
        yield c
    finally:
        try:
            logs = c.compose("logs", "--no-color", "--tail", "300", timeout=120)
        except RuntimeError as exc:
            logs = str(exc)
        (folder / "compose.log").write_text(logs)
        print(f"\n[cluster] compose logs: {folder / 'compose.log'}")
        # No drain at the end: nothing is checked after it.
        c.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=300)


# Module scope: each test module brings up its own deployment and takes it down before the
# next module starts (test_ha.py's Sentinel deployment is never up beside this one).
@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    require_images()
    folder = Path(tempfile.mkdtemp(prefix="tokenq-cluster-"))
    env = base_env(folder)
    c = Cluster(env=env, keys=make_secrets(folder),
                lb_url=f"http://127.0.0.1:{env['API_PORT']}")
    with running(c, SERVICES, COUNTS, folder):
        yield c


@pytest.fixture(scope="module")
def ha_cluster() -> Iterator[Cluster]:
    """Profile ha: the primary, its replica and three sentinels; two API replicas and two
    CPU workers reach Redis through the sentinels, and a 202 waits for the replica."""
    require_images()
    folder = Path(tempfile.mkdtemp(prefix="tokenq-ha-"))
    env = {**base_env(folder), **HA_ENV, "REDIS_SENTINEL_PASSWORD": secrets.token_urlsafe(16)}
    c = Cluster(env=env, keys=make_secrets(folder), lb_url="", project=HA_PROJECT,
                profiles=("ha",))
    with running(c, HA_SERVICES, COUNTS, folder):
        c.lb_url = c.api_urls()[0]  # no load balancer here: each test picks a replica
        yield c
