"""A sampled token the grammar refuses is drawn again over the likeliest candidates, not
the whole vocabulary, when that is provably the same draw (workers/engines/
llamacpp_sampling.py, LikelyFirst). Before, a job whose logit bias favoured a token its
schema refuses made the engine apply the grammar to all 49k tokens every step (40-80 ms
each on SmolLM2), and every other job on the worker waited for it. Real model."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from llama_cpp import llama_cpp as ll

from tests.integration.test_file_expiry import wait_until
from tests.integration.test_llamacpp_engine import Collector, request, start_engine
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


def test_sampling_without_top_k_or_with_a_raising_penalty_keeps_the_whole_draw() -> None:
    def of(**kw: Any) -> sampling.LikelyFirst | None:
        p = SamplingParams(**{"max_tokens": 8, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                              "repetition_penalty": 1.0, "json_schema": SCHEMA, **kw})
        return sampling.LikelyFirst.of(49_152, p)

    assert of(temperature=0.8) is None  # no top-k: every token may be drawn
    assert of(repetition_penalty=0.9) is None  # these can raise a logit
    assert of(frequency_penalty=-1.0) is None
    assert of(presence_penalty=-0.5) is None
    assert of(temperature=0.7, top_p=0.9, top_k=40) is not None
    lowering = of(repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5)
    assert lowering is not None and lowering.pre is not None
    lowering.free()


def test_penalties_that_only_lower_keep_the_likeliest_first(
        engine: tuple[LlamaCppEngine, Collector], monkeypatch: pytest.MonkeyPatch) -> None:
    """Penalties move logits by history, so the draw over the likeliest uses the chain's
    own bias and penalty samplers, fed the same tokens: the same tokens as the whole
    vocabulary's draw, without its pass at every step."""
    params = {"logit_bias": {NEWLINE: 100.0}, "repetition_penalty": 1.3,
              "frequency_penalty": 0.4, "presence_penalty": 0.3}
    eng, col = engine
    with monkeypatch.context() as m:
        whole = Count(m, likely=False)
        expected = run(eng, col, **params)
    with monkeypatch.context() as m:
        count = Count(m, likely=True)
        got = run(eng, col, **params)
    assert got == expected
    assert len(got) > 20 and whole.whole >= len(got) // 2, (len(got), whole.whole)
    assert count.likely >= len(got) // 2 and count.whole <= 2, (count.likely, count.whole)


def test_a_penalty_that_drops_the_winner_below_the_rest_takes_the_whole_pass(
        engine: tuple[LlamaCppEngine, Collector]) -> None:
    """The exactness condition reads the candidates' logits after the penalties: a
    repeated token halved by `repetition_penalty` 2 is no longer above the best token left
    out, so the likeliest cannot decide, and the whole vocabulary's draw (the other token)
    is the one taken. Reading the logits before the penalties drew the repeated one."""
    eng, _ = engine
    p = SamplingParams(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0,
                       repetition_penalty=2.0, json_schema=SCHEMA)
    s = sampling.Sampler(eng.vocab.vocab, eng.vocab.n_vocab, p)
    try:
        lf = s._likely
        assert lf is not None
        allowed = [t for t in range(eng.vocab.n_vocab) if s._allowed(t)]
        refused = [t for t in range(eng.vocab.n_vocab) if t not in set(allowed)]
        a, b = allowed[0], allowed[1]
        logits = np.full(eng.vocab.n_vocab, -50.0, dtype=np.float32)
        logits[refused[:sampling.LIKELY - 1]] = 9.8  # the rest of the likeliest: refused
        logits[a], logits[b] = 10.0, 9.5  # b: the best left out of them
        assert lf.pick(s, logits) == a
        lf.accept(a)  # a was generated before: the penalty halves its logit, to 5
        ll.llama_sampler_accept(s.chain, a)
        assert lf.pick(s, logits) is None
        assert s._pick(logits, with_grammar=True) == b
    finally:
        s.free()


def test_jobs_that_need_whole_passes_sit_out_steps(
        engine: tuple[LlamaCppEngine, Collector], monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling without top-k keeps the whole-vocabulary pass, and a bias on a refused
    token makes it happen at every step, on the engine thread: three such jobs held every
    step of a plain job on the worker for three passes. Such jobs now sit out steps for
    twice their passes' time (llamacpp_seq.py `rest_after_slow`): the passes take about a
    third of the engine's time at most, whatever their number. A ratio of times on one
    machine, so it holds on a slower or a faster one."""
    eng, col = engine
    passes: list[tuple[float, float]] = []
    pick = sampling.Sampler._pick

    def timed(s: sampling.Sampler, logits: Any, *, with_grammar: bool) -> int:
        t0 = time.perf_counter()
        try:
            return pick(s, logits, with_grammar=with_grammar)
        finally:
            if with_grammar:
                passes.append((t0, time.perf_counter() - t0))

    monkeypatch.setattr(sampling.Sampler, "_pick", timed)
    slow = [f"slow{next(ids)}" for _ in range(3)]
    for i, job in enumerate(slow):
        params = SamplingParams(max_tokens=160, temperature=0.9, top_p=1.0, top_k=0,
                                seed=i, repetition_penalty=1.0, json_schema=SCHEMA,
                                logit_bias={NEWLINE: 100.0})
        eng.submit(EngineRequest(job_id=job, attempt=1, params=params,
                                 messages=[{"role": "user", "content": "Describe a cat."}]))
    wait_until("every slow job is inside a string", lambda: len(passes) >= 6, 60)
    plain = f"plain{next(ids)}"
    t0 = time.perf_counter()
    eng.submit(request(plain, "Count from one to twenty.", max_tokens=48))
    col.wait([plain])
    t1 = time.perf_counter()
    spent = sum(d for s, d in passes if t0 <= s <= t1)
    col.wait(slow, timeout=300)
    assert len(col.ids[plain]) >= 24
    print(f"whole passes: {spent:.2f} s of the plain job's {t1 - t0:.2f} s "
          f"({spent / (t1 - t0):.0%})")  # (pytest -s shows it: the figure docs cite)
    assert spent / (t1 - t0) < 0.5, (spent, t1 - t0, len(passes))
