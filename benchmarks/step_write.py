"""The worker's write of one engine step at one stream: `JobStore.write_step` with one job's
one token, as the publisher sends it after every step of a single-stream job.

Starts a private Redis (no persistence) in a temporary folder, runs N steps, and prints
the median wall time per step and the CPU this process spent per step (Python, redis-py,
the socket calls), then Redis' own time per call of the append script (`INFO
commandstats`: its XADD, PUBLISH and HGETs included). Usage:
    .venv/bin/python benchmarks/step_write.py [--steps 3000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import redis

from tokenq.shared.jobs import Acquired, TokenWrite, dumps
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.schemas import JobSpec, SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.shared.store import JobStore


def main() -> None:
    parser = argparse.ArgumentParser(description="one single-token step write, timed")
    parser.add_argument("--steps", type=int, default=3000)
    n = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp), appendonly=False).start()
        try:
            r = redis.Redis(port=server.port, decode_responses=True)
            store = JobStore(r, Settings(stream_maxlen=1000, result_ttl_s=60,
                                         worker=WorkerSettings(lease_ttl_s=60)))
            spec = JobSpec(prompt="hi", params=SamplingParams(
                max_tokens=n + 1, temperature=0, top_p=1, top_k=0, repetition_penalty=1))
            store.create("job_w", {"id": "job_w", "owner": "t", "model": "m",
                                   "state": "queued", "attempts": "0",
                                   "created_at": repr(time.time()),
                                   "spec": spec.model_dump_json(), "request": "{}"},
                         tenant="t", queue="q", message=dumps({"properties": {}}))
            got = store.acquire("job_w", "w")
            assert isinstance(got, Acquired)
            walls = []
            cpu0 = time.process_time()
            for i in range(n):
                t0 = time.perf_counter()
                store.write_step({("job_w", got.attempt): [
                    TokenWrite(dumps({"text": "tok", "index": i}), 5, i)]}, [])
                walls.append(time.perf_counter() - t0)
            cpu = time.process_time() - cpu0
            script = r.info("commandstats").get("cmdstat_evalsha", {})
            r.close()
        finally:
            server.stop()
    print(f"{n} single-token step writes: wall median "
          f"{1e6 * statistics.median(walls[n // 10:]):.0f} us, "
          f"CPU {1e6 * cpu / n:.0f} us a step (this process)")
    print(f"Redis: {script.get('usec_per_call', float('nan')):.1f} us per script call "
          f"({script.get('calls', 0)} calls: the appends, the job's create and acquire)")


if __name__ == "__main__":
    main()
