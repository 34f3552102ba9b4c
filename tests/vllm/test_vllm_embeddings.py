"""/v1/embeddings on a vLLM embedding worker (the pooling runner) with the official SDK:
all-MiniLM-L6-v2 from its wheel's safetensors, through the queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import redis

from tests.surface_checks import job_records
from tests.vllm.test_conformance_embeddings import _wheel_dir
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings

pytestmark = pytest.mark.vllm

VEMBED = "minilm-vllm"


@pytest.fixture(scope="module")
def vembed_stack(vllm_importable: None, redis_server: EmbeddedRedis,  # noqa: ARG001
                 state_dir: Path) -> Iterator[Stack]:
    path = state_dir / "vllm-embed-models.json"
    path.write_text(json.dumps({VEMBED: {"backend": "vllm", "source": "hf", "embedding": True,
                                         "path": str(_wheel_dir()), "max_model_len": 256,
                                         "max_num_seqs": 32}}))
    settings = Settings(redis_url=redis_server.url, state_dir=state_dir, models_file=path)
    st = Stack(settings, models=[VEMBED], quiet=True)
    st.start_parts()
    try:
        st.wait_ready(models=[VEMBED], timeout=300)
        yield st
    finally:
        st.stop()


@pytest.fixture
def eoai(vembed_stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=vembed_stack.url + "/v1", api_key="unused", max_retries=0,
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


def test_bad_input_is_400_and_enqueues_nothing(eoai: openai.OpenAI,
                                               vembed_stack: Stack) -> None:
    r = redis.Redis.from_url(vembed_stack.redis_url, decode_responses=True)
    before = job_records(r)
    for kw in ({"input": "word " * 300}, {"input": "x", "dimensions": 64}):
        with pytest.raises(openai.BadRequestError):
            eoai.embeddings.create(model=VEMBED, **kw)  # type: ignore[arg-type]
    assert job_records(r) == before
    r.close()
