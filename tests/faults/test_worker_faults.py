"""Workers die, drain, crash on a poison job, or outlive the visibility timeout: every job
still ends exactly once, and no client sees a duplicated or missing token."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from tests.faults.harness import (
    FAKE,
    check_exactly_once,
    fake_stack,
    read_job,
    redis_of,
    submit,
    supervisor,
    wait_count,
    wait_terminal,
    worker_id,
)
from tokenq.shared import keys

N = 200
TOKENS = 20  # at 40 tok/s: 0.5 s a job, 16 slots over two workers


def test_200_jobs_without_faults_end_exactly_once(tmp_path: Path) -> None:
    with fake_stack(tmp_path) as st, httpx.Client(base_url=st.url, timeout=30) as c:
        r = redis_of(st)
        t0 = time.monotonic()
        ids = submit(c, N, TOKENS)
        wait_terminal(r, ids, timeout=90)
        runs = check_exactly_once(r, ids, TOKENS)
        assert all(run.attempts == 1 and len(run.starts) == 1 for run in runs)
        print(f"\n[faults] {N} jobs, no faults: {N}/{N} succeeded once in "
              f"{time.monotonic() - t0:.1f}s")


def test_sigkill_worker_at_half_loses_nothing(tmp_path: Path) -> None:
    with fake_stack(tmp_path) as st, httpx.Client(base_url=st.url, timeout=30) as c:
        r = redis_of(st)
        ids = submit(c, N, TOKENS)
        wait_count(r, ids, N // 2, timeout=60)
        victim = worker_id(st, 0)
        st.worker_procs[0][1].send_signal(signal.SIGKILL)
        killed_at = time.time()
        wait_terminal(r, ids, timeout=90)
        runs = check_exactly_once(r, ids, TOKENS)
        # The jobs the dead worker was running: taken over once, by another worker.
        taken = [run for run in runs if len(run.starts) > 1]
        assert taken, "the kill hit no running job"
        for run in taken:
            assert run.starts[0][1]["worker"] == victim
            assert [s[1]["attempt"] for s in run.starts] == [1, 2]
            assert run.starts[1][1]["worker"] != victim
        recovery = max(run.starts[1][0] for run in taken) - killed_at
        assert recovery < 20, recovery  # issue target: taken over within 20 s of the kill
        # The dead worker's heartbeat is forgotten (3 x worker_ttl 5 s), the live one's kept.
        deadline = time.monotonic() + 30
        while r.hexists("tokenq:workers", victim):
            assert time.monotonic() < deadline, "the dead worker's heartbeat stayed"
            time.sleep(0.5)
        assert r.hexists("tokenq:workers", worker_id(st, 1))
        print(f"\n[faults] SIGKILL at {N // 2}/{N}: {len(taken)} running jobs taken over, "
              f"0 lost, 0 duplicate tokens; recovery {recovery:.1f}s after the kill "
              f"(lease 3 s)")


def test_sigterm_mid_batch_hands_back_and_restarts_quickly(tmp_path: Path) -> None:
    with fake_stack(tmp_path, rate=20) as st, httpx.Client(base_url=st.url, timeout=30) as c:
        r = redis_of(st)
        ids = submit(c, 48, 60)  # 3 s a job: the 1 s drain grace cannot finish them
        wait_count(r, ids, 16, timeout=60)
        victim = worker_id(st, 0)
        st.worker_procs[0][1].send_signal(signal.SIGTERM)
        wait_terminal(r, ids, timeout=120)
        runs = check_exactly_once(r, ids, 60)
        handed = [run for run in runs if len(run.starts) > 1]
        assert handed, "SIGTERM handed no job back"
        gaps = []
        for run in handed:
            assert run.starts[0][1]["worker"] == victim
            last_before = max(t for t, _, _ in run.tokens if t <= run.starts[1][0])
            gaps.append(run.starts[1][0] - last_before)
        assert max(gaps) <= 5, gaps
        assert st.worker_procs[0][1].wait(30) is not None
        print(f"\n[faults] SIGTERM mid-batch: {len(handed)} jobs handed back, restarted "
              f"after max {max(gaps):.2f}s (last token -> new attempt), 0 lost")


def test_poison_job_fails_after_three_attempts(tmp_path: Path) -> None:
    with fake_stack(tmp_path, rate=100) as st, supervisor(st) as restarts, \
            httpx.Client(base_url=st.url, timeout=30) as c:
        r = redis_of(st)
        poison = submit(c, 1, 10, prompt="please [[crash]]")[0]
        ids = submit(c, 40, 10)
        wait_terminal(r, [poison, *ids], timeout=120)
        run = read_job(r, poison)
        assert run.state == "failed" and run.attempts == 3, run
        assert run.terminal == ["error"]
        err = r.hget(f"tokenq:job:{poison}", "error") or ""
        assert "max_attempts" in err
        check_exactly_once(r, ids, 10)
        assert len(restarts) >= 2  # each attempt took its worker down
        print(f"\n[faults] poison job: failed after {run.attempts} attempts "
              f"({len(restarts)} worker restarts); 40/40 others succeeded once")


def test_job_longer_than_visibility_timeout_runs_once(tmp_path: Path) -> None:
    env = {"TOKENQ_VISIBILITY_TIMEOUT_S": "2", "TOKENQ_UNACKED_RESTORE_S": "1"}
    with fake_stack(tmp_path, rate=10, env=env) as st, \
            httpx.Client(base_url=st.url, timeout=30) as c:
        r = redis_of(st)
        ids = submit(c, 2, 80)  # 8 s each, four times the visibility timeout
        wait_terminal(r, ids, timeout=60)
        for run in check_exactly_once(r, ids, 80):
            assert run.attempts == 1 and len(run.starts) == 1
        # Celery did redeliver the tickets (the scenario happened); each copy found no job
        # waiting (shared/lua/pick.lua) and was dropped.
        empty = int(r.get(f"{keys.lane(keys.queue(FAKE, 'normal'))}:empty") or 0)
        assert empty >= 1
        print(f"\n[faults] 8 s jobs, 2 s visibility timeout: {empty} redelivered tickets "
              "found no job; each job ran once")
