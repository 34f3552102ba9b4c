"""Seeded sampling on the llama.cpp engine: a step's rows are sampled on two threads (with
a second core), and a job still draws exactly what it draws alone; the fast draw over a
long vocabulary draws what llama.cpp's own sampler draws."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp as ll
import numpy as np
import pytest

from tests.conftest import GEMMA
from tests.integration.test_llamacpp_engine import PROMPTS, start_engine
from tokenq.shared.schemas import SamplingParams
from tokenq.shared.settings import Settings
from tokenq.shared.vocab import Vocab
from tokenq.shared.weights import gguf_path
from tokenq.workers.engines.base import EngineRequest
from tokenq.workers.engines.llamacpp_context import create_context
from tokenq.workers.engines.llamacpp_sampling import (
    BLOCK,
    FAST_CANDIDATES,
    Sampler,
    top_k_candidates,
)


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


@pytest.fixture(scope="module")
def gemma(state_dir: Path) -> Iterator[tuple[Vocab, Any]]:
    """Gemma 3's vocabulary (262k: the fast draw's case) and a one-sequence context."""
    settings = Settings(state_dir=state_dir)
    cfg = settings.models()[GEMMA].model_copy(update={"n_ctx": 512})
    vocab = Vocab(gguf_path(cfg, state_dir), cfg, vocab_only=False)
    ctx = create_context(vocab.model, cfg, 1)
    yield vocab, ctx
    ll.llama_free(ctx)
    ll.llama_model_free(vocab.model)


def decode(ctx: Any, tokens: list[int]) -> None:
    arr = (ll.llama_token * len(tokens))(*tokens)
    assert ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(tokens))) == 0


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_the_fast_draw_is_llama_cpps_own(gemma: tuple[Vocab, Any], temperature: float) -> None:
    """On the same logits with the same seed, the fast draw (top-k candidates found with
    numpy, greedy as numpy's argmax) picks what llama.cpp's `llama_sampler_sample` over the
    whole vocabulary picks, token after token."""
    vocab, ctx = gemma
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    params = SamplingParams(max_tokens=40, temperature=temperature, top_p=0.95, top_k=40,
                            min_p=0.02, seed=7, repetition_penalty=1.0)
    fast, own = (Sampler(vocab.vocab, vocab.n_vocab, params) for _ in range(2))
    own.fast = None
    assert fast.fast == ("greedy" if temperature == 0.0 else "top_k")
    drawn_own = []
    tokens = vocab.tokenize(vocab.render(None, [
        {"role": "user", "content": "Write a short poem about a lighthouse."}]))
    try:
        for _ in range(40):
            decode(ctx, tokens)
            tok = fast.sample(ctx, -1)
            assert tok == own.sample(ctx, -1)
            drawn_own.append(tok)
            tokens = [tok]
    finally:
        fast.free()
        own.free()
    assert len(set(drawn_own)) > 5  # a run of text, not one token repeated


def test_penalties_bias_and_grammar_keep_the_chains_own_draw(
        gemma: tuple[Vocab, Any]) -> None:
    """The fast draw only where nothing before top-k changes a logit; a top-k too large
    for the vocabulary's blocks, or no top-k, reads the whole row in llama.cpp."""
    vocab, _ = gemma
    base = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.95, top_k=40,
                          repetition_penalty=1.0)
    for update in ({"repetition_penalty": 1.1}, {"presence_penalty": 0.5},
                   {"logit_bias": {5: 1.0}}, {"json_schema": {"type": "object"}},
                   {"top_k": 0}, {"top_k": vocab.n_vocab // BLOCK}):
        s = Sampler(vocab.vocab, vocab.n_vocab, base.model_copy(update=update))
        try:
            assert s.fast is None, update
        finally:
            s.free()


def test_top_k_candidates_hold_every_logit_that_can_be_in_the_top_k() -> None:
    rng = np.random.default_rng(3)
    for n in (262_144, 262_144 + 77, 49_152 * 4):
        logits = (rng.standard_normal(n) * 3).astype(np.float32)
        logits[rng.integers(0, n, 30)] = logits.max()  # ties at the very top
        for k in (1, 40, 100):
            ids = top_k_candidates(logits, k)
            assert ids is not None and list(ids) == sorted(ids)
            kth = np.sort(logits)[-k]
            assert set(np.flatnonzero(logits >= kth)) <= set(ids.tolist())
            assert len(ids) <= FAST_CANDIDATES
    flat = np.zeros(262_144, dtype=np.float32)  # every logit tied: too many to hand over
    assert top_k_candidates(flat, 40) is None
    flat[:] = np.nan
    assert top_k_candidates(flat, 40) is None
