"""The llama.cpp engine on a real model: batching must not change what a job generates."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.models import gguf_path
from shared.schemas import SamplingParams
from shared.settings import Settings
from workers.engines.base import EngineRequest, Finished, StepOutput
from workers.engines.llamacpp import LlamaCppEngine

PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


class Collector:
    def __init__(self) -> None:
        self.text: dict[str, list[tuple[int, str]]] = {}
        self.finished: dict[str, Finished] = {}
        self.cond = threading.Condition()

    def sink(self, step: StepOutput) -> None:
        with self.cond:
            for t in step.tokens:
                self.text.setdefault(t.job_id, []).append((t.index, t.text))
            for f in step.finished:
                self.finished[f.job_id] = f
            self.cond.notify_all()

    def wait(self, ids: list[str], timeout: float = 120) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: all(i in self.finished for i in ids), timeout)

    def output(self, job_id: str) -> str:
        pieces = self.text.get(job_id, [])
        assert [i for i, _ in pieces] == list(range(len(pieces)))
        return "".join(t for _, t in pieces)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaCppEngine, Collector]]:
    settings = Settings(state_dir=Path(tmp_path_factory.mktemp("engine")))
    cfg = settings.models()["smollm2-135m-instruct"].model_copy(update={"n_parallel": 4})
    eng = LlamaCppEngine(cfg, gguf_path(cfg, settings.state_dir))
    col = Collector()
    eng.start(col.sink)
    yield eng, col
    eng.close()


def request(job_id: str, prompt: str, max_tokens: int = 24) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0,
                            repetition_penalty=1.0)
    return EngineRequest(job_id=job_id, attempt=1, params=params,
                         messages=[{"role": "user", "content": prompt}])


def test_batched_text_equals_text_alone(engine: tuple[LlamaCppEngine, Collector]) -> None:
    eng, col = engine
    alone = []
    for i, p in enumerate(PROMPTS):
        eng.submit(request(f"alone-{i}", p))
        col.wait([f"alone-{i}"])
        alone.append(col.output(f"alone-{i}"))
    ids = [f"batch-{i}" for i in range(len(PROMPTS))]  # 8 jobs on 4 slots: slots are reused
    for job_id, p in zip(ids, PROMPTS, strict=True):
        eng.submit(request(job_id, p))
    col.wait(ids)
    assert [col.output(j) for j in ids] == alone
    assert all(col.finished[j].reason in ("stop", "length") for j in ids)
    assert eng.stats().running == 0


def test_cancel_one_leaves_the_others_exact(engine: tuple[LlamaCppEngine, Collector]) -> None:
    eng, col = engine
    expected = {}
    for i in range(4):
        eng.submit(request(f"ref-{i}", PROMPTS[i], max_tokens=40))
        col.wait([f"ref-{i}"])
        expected[i] = col.output(f"ref-{i}")
    for i in range(4):
        eng.submit(request(f"mix-{i}", PROMPTS[i], max_tokens=40))
    eng.cancel("mix-2")
    col.wait([f"mix-{i}" for i in range(4)])
    assert col.finished["mix-2"].reason == "cancelled"
    for i in (0, 1, 3):
        assert col.output(f"mix-{i}") == expected[i]
    assert eng.stats().running == 0
