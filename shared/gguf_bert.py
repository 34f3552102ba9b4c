"""A sentence-transformers BERT folder (safetensors) -> a llama.cpp GGUF, once, at first use.

What llama.cpp's convert_hf_to_gguf.py writes for a BERT embedding model (architecture
`bert`, WordPiece vocabulary in its "phantom space" form, mean pooling), with numpy and
the `gguf` package only: no torch, so a CPU-only install can convert the bundled
all-MiniLM-L6-v2 too. Weight matrices are stored as F16; norms, biases and the position
and token-type embeddings as F32 (as llama.cpp's converter does).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_POOLING = {"pooling_mode_mean_tokens": 1, "pooling_mode_cls_token": 2}


def read_safetensors(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw, dtype=_DTYPES[info["dtype"]], count=(b - a) // np.dtype(
            _DTYPES[info["dtype"]]).itemsize, offset=8 + n + a)
        out[name] = arr.reshape(info["shape"])
    return out


def _phantom(tok: str) -> str:
    """WordPiece -> llama.cpp's form: word starts get "▁", continuations lose "##"."""
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def convert(src: Path, dest: Path, name: str) -> Path:
    import gguf

    cfg = json.loads((src / "config.json").read_text())
    pool_cfg = src / "1_Pooling" / "config.json"
    pooling = 1
    if pool_cfg.exists():
        pc = json.loads(pool_cfg.read_text())
        pooling = next((v for k, v in _POOLING.items() if pc.get(k)), 1)
    vocab = (src / "vocab.txt").read_text(encoding="utf-8").splitlines()
    special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    tmp = dest.with_suffix(f".{os.getpid()}.partial")  # API and worker may race: last wins
    w = gguf.GGUFWriter(str(tmp), "bert")
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([_phantom(t) for t in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL
                       for t in vocab])
    gguf.SpecialVocab(src, n_vocab=len(vocab)).add_to_gguf(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    for hf_name, arr in read_safetensors(src / "model.safetensors").items():
        gg = names.get_name(hf_name.removeprefix("bert."), try_suffixes=(".weight", ".bias"))
        if gg is None:  # position_ids, the pooler head: not used for embeddings
            continue
        # llama.cpp adds the position and token-type rows as they are: F32, as its converter
        half = arr.ndim == 2 and gg.split(".")[0] not in ("position_embd", "token_types")
        data = arr.astype(np.float16 if half else np.float32)
        w.add_tensor(gg, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dest)
    return dest
