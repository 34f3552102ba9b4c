"""/v1/embeddings with the official SDK on the bundled all-MiniLM-L6-v2 (llama.cpp pooling)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import redis

from tests.conftest import EMBED, SMOL
from tokenq.cli.stack import Stack
from tokenq.shared import keys

PARAPHRASES = ["The customer was charged twice for the same order.",
               "The client got billed two times for one purchase."]
UNRELATED = "The weather in Paris is sunny today."


@pytest.fixture
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


def test_listed_with_its_context(oai: openai.OpenAI) -> None:
    listed = {m.id: m for m in oai.models.list()}
    assert EMBED in listed and listed[EMBED].max_model_len == 256  # type: ignore[attr-defined]


def test_paraphrase_ranks_above_unrelated(oai: openai.OpenAI, client: httpx.Client) -> None:
    out = oai.embeddings.create(model=EMBED, input=[*PARAPHRASES, UNRELATED])
    assert [d.index for d in out.data] == [0, 1, 2] and out.object == "list"
    v = np.array([d.embedding for d in out.data])
    assert v.shape == (3, 384)
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-4)
    sims = v @ v.T
    assert sims[0, 1] > 0.6 > 0.2 > max(sims[0, 2], sims[1, 2])
    assert out.usage.prompt_tokens == out.usage.total_tokens > 20
    # A single string is one input; it gets the same vector as in the batch.
    one = oai.embeddings.create(model=EMBED, input=PARAPHRASES[0])
    assert len(one.data) == 1
    assert np.allclose(one.data[0].embedding, v[0], atol=1e-4)
    # It ran as a job through the queue.
    resp = oai.embeddings.with_raw_response.create(model=EMBED, input="hello")
    rec = client.get(f"/v1/jobs/{resp.headers['x-tokenq-job-id']}").json()
    assert rec["status"] == "succeeded" and rec["model"] == EMBED


def test_base64_and_dimensions(oai: openai.OpenAI, client: httpx.Client) -> None:
    floats = oai.embeddings.create(model=EMBED, input=PARAPHRASES, encoding_format="float")
    raw = client.post("/v1/embeddings", json={"model": EMBED, "input": PARAPHRASES,
                                              "encoding_format": "base64"}).json()
    for d, f in zip(raw["data"], floats.data, strict=True):
        vec = np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32)
        assert np.allclose(vec, f.embedding, atol=1e-5)
    same = oai.embeddings.create(model=EMBED, input="x", dimensions=384)
    assert len(same.data[0].embedding) == 384


def test_many_inputs_batched(oai: openai.OpenAI) -> None:
    texts = [f"Call {i}: the customer asks about invoice number {i}." for i in range(70)]
    out = oai.embeddings.create(model=EMBED, input=texts)  # over 2 engine steps of 32
    assert len(out.data) == 70 and [d.index for d in out.data] == list(range(70))
    alone = oai.embeddings.create(model=EMBED, input=texts[45])
    # Batched with 69 others, the input's tokens meet other float sums than alone: the
    # unit vectors differ by ~1e-4 per component (seen up to 1.5e-4), as llama-server's do.
    got, ref = np.array(out.data[45].embedding), np.array(alone.data[0].embedding)
    assert np.allclose(got, ref, atol=1e-3) and float(got @ ref) > 0.9999


@pytest.mark.parametrize("body", [
    {"input": "word " * 300},  # over the 256-token context
    {"input": ["fine", "word " * 300]},
    {"input": []},
    {"input": ""},
    {"input": ["fine", ""]},  # not a context-length error: input[1] is empty
    {"input": "x", "dimensions": 128},
    {"input": "x", "encoding_format": "int8"},
    {"input": ["x"] * 2049},
    {"input": "x", "model": SMOL},  # not an embedding model
])
def test_bad_input_is_400_and_enqueues_nothing(client: httpx.Client, stack_redis: redis.Redis,
                                               body: dict[str, object]) -> None:
    before = stack_redis.llen(keys.queue(EMBED, "normal"))
    jobs = stack_redis.zcard(keys.tenant_jobs("default"))
    resp = client.post("/v1/embeddings", json={"model": EMBED, **body})
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "code", "param"}
    assert stack_redis.llen(keys.queue(EMBED, "normal")) == before
    assert stack_redis.zcard(keys.tenant_jobs("default")) == jobs


def test_chat_on_the_embedding_model_is_400(client: httpx.Client) -> None:
    resp = client.post("/v1/chat/completions", json={
        "model": EMBED, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400, resp.text
