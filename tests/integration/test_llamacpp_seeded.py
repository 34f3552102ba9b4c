"""Seeded sampling on the llama.cpp engine: a step's rows are sampled on two threads (with
a second core), and a job still draws exactly what it draws alone."""

from __future__ import annotations

from pathlib import Path

from shared.schemas import SamplingParams
from tests.integration.test_llamacpp_engine import PROMPTS, start_engine
from workers.engines.base import EngineRequest


def seeded(job_id: str, prompt: str, seed: int) -> EngineRequest:
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, top_k=40, seed=seed,
                            repetition_penalty=1.0)
    return EngineRequest(job_id=job_id, attempt=1, params=params,
                         messages=[{"role": "user", "content": prompt}])


def test_seeded_jobs_batched_draw_what_they_draw_alone(tmp_path: Path) -> None:
    eng, col = start_engine(tmp_path, prefix_cache=False, n_threads=2)
    try:
        assert eng.sampling._helper is not None  # the split path is what runs here
        alone = []
        for i, p in enumerate(PROMPTS[:4]):
            eng.submit(seeded(f"alone-{i}", p, seed=100 + i))
            col.wait([f"alone-{i}"])
            alone.append(col.ids[f"alone-{i}"])
        ids = [f"batch-{i}" for i in range(4)]
        for i, (job_id, p) in enumerate(zip(ids, PROMPTS[:4], strict=True)):
            eng.submit(seeded(job_id, p, seed=100 + i))
        col.wait(ids)
        assert [col.ids[j] for j in ids] == alone
        assert len({tuple(t) for t in alone}) == 4  # four different draws, not one repeated
    finally:
        eng.close()
