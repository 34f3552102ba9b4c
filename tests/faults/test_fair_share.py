"""Fair share on the fake stack: a light tenant's jobs are not stuck behind a heavy
tenant's backlog; the same run with `fair_share = false` (FIFO) shows the difference."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.faults.harness import fake_stack, redis_of, submit, wait_terminal
from tokenq.shared import keys

pytestmark = pytest.mark.timeout(600)

KEYS = "k-heavy:heavy,k-light:light"
HEAVY_JOBS, LIGHT_JOBS, MAX_TOKENS = 40, 4, 20


def heavy_ahead_of_light(tmp: Path, fair: bool) -> int:
    """How many of the heavy tenant's jobs started after the light tenant submitted and
    before its last job started."""
    tmp.mkdir()
    env = {"TOKENQ_API_KEYS": KEYS, "TOKENQ_FAIR_SHARE": "true" if fair else "false"}
    with fake_stack(tmp, workers=1, slots=2, rate=40.0, env=env) as st:
        r = redis_of(st)
        heavy = httpx.Client(base_url=st.url, timeout=30,
                             headers={"Authorization": "Bearer k-heavy"})
        light = httpx.Client(base_url=st.url, timeout=30,
                             headers={"Authorization": "Bearer k-light"})
        heavy_ids = submit(heavy, HEAVY_JOBS, MAX_TOKENS)
        light_ids = submit(light, LIGHT_JOBS, MAX_TOKENS)
        wait_terminal(r, light_ids, timeout=120)
        since = float(r.hget(keys.job(light_ids[0]), "created_at") or 0)
        until = max(float(r.hget(keys.job(j), "started_at") or 0) for j in light_ids)
        started = [r.hget(keys.job(j), "started_at") for j in heavy_ids]
        ahead = sum(1 for s in started if s is not None and since < float(s) < until)
        wait_terminal(r, heavy_ids, timeout=180)  # nothing lost on either path
        return ahead


def test_light_tenant_is_not_stuck_behind_a_heavy_backlog(tmp_path: Path) -> None:
    fair = heavy_ahead_of_light(tmp_path / "fair", fair=True)
    fifo = heavy_ahead_of_light(tmp_path / "fifo", fair=False)
    # Fair: the light tenant alternates with the heavy one (about LIGHT_JOBS of the heavy
    # one's in between). FIFO: it waits for the heavy backlog submitted before it.
    assert fair <= 2 * LIGHT_JOBS + 2, (fair, fifo)
    assert fifo >= HEAVY_JOBS // 2, (fair, fifo)
