"""A sampled token the grammar refuses is drawn again over the likeliest candidates, not
the whole vocabulary, when that is provably the same draw (workers/engines/
llamacpp_sampling.py, LikelyFirst). Before, a job whose logit bias favoured a token its
schema refuses made the engine apply the grammar to all 49k tokens every step (40-80 ms
each on SmolLM2), and every other job on the worker waited for it. Real model."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.test_llamacpp_engine import Collector, start_engine
from tokenq.shared.schemas import SamplingParams
from tokenq.workers.engines import llamacpp_sampling as sampling
from tokenq.workers.engines.base import EngineRequest
from tokenq.workers.engines.llamacpp import LlamaCppEngine

PROPS = {f"s{i}": {"type": "string"} for i in range(6)}
SCHEMA = {"type": "object", "properties": PROPS, "required": list(PROPS)}
NEWLINE = 198  # SmolLM2's "\n": never inside a JSON string, so the grammar refuses it there
ids = itertools.count()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LlamaCppEngine, Collector]]:
    eng, col = start_engine(tmp_path_factory.mktemp("refusals"), prefix_cache=False)
    yield eng, col
    eng.close()


class Count:
    """How each refused token was drawn again."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, likely: bool) -> None:
        self.whole = self.likely = 0
        pick, likely_pick = sampling.Sampler._pick, sampling.LikelyFirst.pick

        def counted_pick(s: sampling.Sampler, logits: Any, *, with_grammar: bool) -> int:
            self.whole += with_grammar
            return pick(s, logits, with_grammar=with_grammar)

        def counted_likely(lf: sampling.LikelyFirst, s: sampling.Sampler,
                           logits: Any) -> int | None:
            got = likely_pick(lf, s, logits) if likely else None
            self.likely += got is not None
            return got

        monkeypatch.setattr(sampling.Sampler, "_pick", counted_pick)
        monkeypatch.setattr(sampling.LikelyFirst, "pick", counted_likely)


def run(eng: LlamaCppEngine, col: Collector, **params: Any) -> list[int]:
    job = f"g{next(ids)}"
    kw: dict[str, Any] = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                          "repetition_penalty": 1.0, "json_schema": SCHEMA, **params}
    eng.submit(EngineRequest(job_id=job, attempt=1, params=SamplingParams(**kw),
                             messages=[{"role": "user", "content": "Describe a cat."}]))
    col.wait([job])
    return col.ids[job]


CASES = {
    "greedy, a refused token biased up": {"logit_bias": {NEWLINE: 100.0}},
    "top-k 40, seeded, biased": {"temperature": 0.9, "top_k": 40, "seed": 7,
                                 "logit_bias": {NEWLINE: 100.0, 13: 5.0}},
    "greedy, no bias": {},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_likeliest_first_draws_what_the_whole_vocabulary_draws(
        engine: tuple[LlamaCppEngine, Collector], monkeypatch: pytest.MonkeyPatch,
        case: str) -> None:
    eng, col = engine
    with monkeypatch.context() as m:
        whole = Count(m, likely=False)
        expected = run(eng, col, **CASES[case])
    with monkeypatch.context() as m:
        count = Count(m, likely=True)
        got = run(eng, col, **CASES[case])
    assert got == expected
    assert whole.likely == 0 and whole.whole > 0  # the grammar refused some sampled tokens
    assert count.likely > 0
    if "biased" in case:  # the biased token is refused at every step: inside the strings
        # (where the whole pass is dear: most tokens may go on a string) the likeliest
        # hold the draw; top-k still takes the whole pass where fewer than k tokens may
        # come (a key, a comma: the grammar refuses those at their first byte, cheaply)
        assert count.whole < whole.whole and count.likely >= count.whole, (
            count.whole, count.likely, whole.whole)


def test_a_refused_biased_token_costs_no_whole_vocabulary_pass(
        engine: tuple[LlamaCppEngine, Collector], monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: a schema of strings and a bias on a token no string may hold. Without
    the fix, each of the job's steps inside a string applied the grammar to the whole
    vocabulary."""
    eng, col = engine
    count = Count(monkeypatch, likely=True)
    out = run(eng, col, logit_bias={NEWLINE: 100.0})
    assert len(out) > 20
    assert count.likely >= len(out) // 2, (count.likely, len(out))
    assert count.whole <= 2, count.whole


def test_sampling_without_top_k_or_with_penalties_keeps_the_whole_draw() -> None:
    p = SamplingParams(max_tokens=8, temperature=0.8, top_p=1.0, top_k=0,
                       repetition_penalty=1.0, json_schema=SCHEMA)
    assert sampling.LikelyFirst.of(49_152, p) is None
    p = SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0,
                       repetition_penalty=1.1, json_schema=SCHEMA)
    assert sampling.LikelyFirst.of(49_152, p) is None
    p = SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0,
                       repetition_penalty=1.0, frequency_penalty=-1.0, json_schema=SCHEMA)
    assert sampling.LikelyFirst.of(49_152, p) is None
    p = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, top_k=40,
                       repetition_penalty=1.0, json_schema=SCHEMA)
    assert sampling.LikelyFirst.of(49_152, p) is not None
