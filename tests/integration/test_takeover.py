"""SIGTERM a real llama.cpp worker mid-stream: it hands the job back within its drain grace
and exits; another worker continues the stream. (SIGKILL: tests/faults.)"""

from __future__ import annotations

import signal

import httpx

from tests.faults.test_real_engine_takeover import assert_one_contiguous_stream, stream_through
from tokenq.cli.stack import Stack


def test_sigterm_hands_running_job_back_and_exits(client: httpx.Client, stack: Stack) -> None:
    # 200 tokens take 5 s or more here; the drain grace is 1 s in tests.
    job_id, seen, _, exit_s = stream_through(client, stack, signal.SIGTERM, max_tokens=200)
    assert_one_contiguous_stream(client, job_id, seen)
    assert exit_s < 10, exit_s  # grace + hand-back, not the whole job
