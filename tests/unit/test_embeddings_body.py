"""An embeddings response is JSON text encoded a vector at a time (api/openai/embeddings.py
`body_json`), on the CPU pool when large: the event loop keeps its turns meanwhile.

Before, 2,048 vectors as floats (16 MB of JSON) were built and encoded on the event loop,
~1 s a response with every stream of the replica standing still; encoded in one json.dumps
from a thread, the call would still hold the GIL, and the loop with it, for all of it."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tokenq.api.openai import batch_files, embeddings
from tokenq.shared.schemas import JobRecord, Usage

DIM = 384


def _record(n: int) -> JobRecord:
    rng = np.random.default_rng(7)
    vectors = [base64.b64encode(rng.standard_normal(DIM).astype(np.float32).tobytes()).decode()
               for _ in range(n)]
    return JobRecord.from_hash({
        "id": "job_abc", "owner": "alpha", "model": "emb", "state": "succeeded",
        "created_at": "1.0", "request": "{}", "output": json.dumps(vectors),
        "usage": Usage(prompt_tokens=n, completion_tokens=0).model_dump_json()})


def test_the_body_is_openais_shape() -> None:
    rec = _record(3)
    body = json.loads(embeddings.body_json(rec, "emb-x", "float"))
    assert body["object"] == "list" and body["model"] == "emb-x" and body["id"] == "embd-abc"
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    raw = json.loads(rec.output or "")
    assert np.allclose(body["data"][1]["embedding"],
                       np.frombuffer(base64.b64decode(raw[1]), dtype=np.float32))
    b64 = json.loads(embeddings.body_json(rec, "emb-x", "base64"))
    assert [d["embedding"] for d in b64["data"]] == raw
    line = json.loads(batch_files.line_text("/v1/embeddings", rec, "cid-1", None, "base64"))
    assert line["custom_id"] == "cid-1" and line["error"] is None
    assert line["response"]["status_code"] == 200 and line["response"]["request_id"] == "job_abc"
    assert line["response"]["body"] == {**b64, "model": "emb"}  # the record's model


def test_a_large_body_leaves_the_loop_its_turns() -> None:
    rec = _record(2048)

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as pool:
            start = time.perf_counter()
            job = loop.run_in_executor(pool, embeddings.body_json, rec, "emb", "float")
            worst, last = 0.0, time.perf_counter()
            while not job.done():
                await asyncio.sleep(0.002)
                now = time.perf_counter()
                worst, last = max(worst, now - last), now
            text = await job
            took = time.perf_counter() - start
        assert len(text) > 10_000_000
        return worst, took

    worst, took = asyncio.run(main())
    print(f"[embeddings body] {took * 1000:.0f} ms, the loop's worst lag {worst * 1000:.0f} ms")
    assert worst < max(0.1, took / 3), (worst, took)
