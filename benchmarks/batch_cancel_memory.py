"""Redis memory a batch cancelled before its lines were enqueued leaves behind.

A fake-engine stack (no model); one batch of N lines, cancelled right after its create,
then Redis' `used_memory` before and after, per line. Usage:
    .venv/bin/python benchmarks/batch_cancel_memory.py [N]   (default 5000)

Run it at two commits to compare (2026-12-02: 5,137 bytes a line when every such line
became a job record, 24 once they became entries of the batch's error file).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.faults.harness import FAKE, fake_stack, redis_of
from tests.faults.test_hostile_batches import wait_done
from tests.integration.test_openai_batches import chat_line


def main(n: int) -> None:
    import openai

    env = {"TOKENQ_API_KEYS": "key-bench:bench"}
    with fake_stack(Path(tempfile.mkdtemp()), workers=1, env=env) as st:
        r = redis_of(st)
        oai = openai.OpenAI(base_url=st.url + "/v1", api_key="key-bench", max_retries=0,
                            timeout=120)
        data = "".join(json.dumps(chat_line(f"call-{i:05d}", f"call {i}", model=FAKE)) + "\n"
                       for i in range(n)).encode()
        f = oai.files.create(file=("in.jsonl", data), purpose="batch")
        time.sleep(1)  # (the upload's own writes settle before the first reading)
        before = int(r.info("memory")["used_memory"])
        b = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                               completion_window="24h")
        oai.batches.cancel(b.id)
        t0 = time.monotonic()
        done = wait_done(oai, b.id, timeout=600)
        swept = time.monotonic() - t0
        time.sleep(1)
        grown = int(r.info("memory")["used_memory"]) - before
        print(f"{done.status} {done.request_counts}: swept in {swept:.1f} s, Redis memory "
              f"+{grown / 1e6:.2f} MB, {grown / n:.0f} bytes a line")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000)
