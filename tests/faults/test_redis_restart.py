"""Redis restarts mid-batch (AOF on): nothing is lost, and workers consume again."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.faults.harness import (
    check_exactly_once,
    fake_stack,
    read_job,
    redis_of,
    submit,
    wait_count,
    wait_terminal,
)


def test_redis_restart_mid_batch_loses_nothing(tmp_path: Path) -> None:
    with fake_stack(tmp_path, rate=20) as st, httpx.Client(base_url=st.url, timeout=30) as c:
        assert st.redis is not None and st.redis.appendonly
        r = redis_of(st)
        ids = submit(c, 160, 10)  # 0.5 s a job, 16 slots: jobs end (and ack) all the time
        wait_count(r, ids, 30, timeout=60)
        st.redis.stop()  # SIGTERM: Redis writes the AOF out and exits
        down_at = time.time()
        time.sleep(1.0)
        st.redis.start()
        up_at = time.time()
        wait_terminal(r, ids, timeout=120)
        runs = check_exactly_once(r, ids, 10)
        # No worker gave up on the broker (kombu's ack on the lost channel used to kill it).
        assert all(p.poll() is None for _, p in st.worker_procs), st.worker_procs
        # Consuming again: the first job that started after the restart.
        first_start = min(s[0] for run in runs for s in run.starts if s[0] > up_at)
        resumed = first_start - up_at
        assert resumed < 30, resumed
        # The API takes new jobs again, and they run.
        more = submit(c, 5, 5)
        wait_terminal(r, more, timeout=60)
        check_exactly_once(r, more, 5)
        retried = sum(len(run.starts) > 1 for run in runs)
        dups = sum(read_job(r, i).duplicates for i in ids)
        print(f"\n[faults] Redis down {up_at - down_at:.1f}s mid-batch: 160/160 succeeded once, "
              f"consuming again {resumed:.1f}s after it came back ({retried} jobs taken over, "
              f"{dups} redelivered copies dropped)")
