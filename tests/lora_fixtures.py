"""Tiny LoRA adapters with random weights, written by the tests themselves.

GGUF (llama.cpp): the layout of llama.cpp's convert_lora_to_gguf.py: general.type =
"adapter", adapter.type = "lora", adapter.lora.alpha, and for each adapted weight
`<name>.lora_a` (numpy shape (r, n_in)) and `<name>.lora_b` (numpy (n_out, r)), so
that W' = W + alpha/r * B @ A as llama.cpp applies it. Shapes come from the base GGUF.

PEFT (vLLM): adapter_config.json + adapter_model.safetensors, the files
`PeftModel.save_pretrained` writes (keys `base_model.model.<module>.lora_A.weight`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# The attention projections: enough to change greedy output, small enough to load in ms.
GGUF_TARGETS = ("attn_q", "attn_v")
PEFT_TARGETS = ("q_proj", "v_proj")


def write_gguf_lora(base: Path, out: Path, *, seed: int, rank: int = 8,
                    alpha: float = 16.0, scale: float = 0.5) -> Path:
    """A rank-`rank` LoRA GGUF for `base` with random A and B (B is not zero, unlike a
    freshly initialised PEFT adapter, so the output changes)."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for t in reader.tensors:
        stem = t.name.removesuffix(".weight")
        if not t.name.endswith(".weight") or stem.split(".")[-1] not in GGUF_TARGETS:
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # GGUF shape is ggml's ne order
        a = (rng.standard_normal((rank, n_in)) * scale / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * scale).astype(np.float32)
        writer.add_tensor(f"{t.name}.lora_a", a)
        writer.add_tensor(f"{t.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def write_peft_lora(base_dir: Path, out: Path, *, seed: int, rank: int = 8,
                    alpha: float = 16.0, scale: float = 0.5) -> Path:
    """A PEFT LoRA folder for the Hugging Face Llama at `base_dir`."""
    from safetensors.numpy import save_file

    cfg = json.loads((base_dir / "config.json").read_text())
    hidden, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    head_dim = hidden // heads
    outs = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for mod in PEFT_TARGETS:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{mod}"
            tensors[f"{stem}.lora_A.weight"] = (
                rng.standard_normal((rank, hidden)) * scale / np.sqrt(hidden)).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (
                rng.standard_normal((outs[mod], rank)) * scale).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(PEFT_TARGETS),
        "base_model_name_or_path": str(base_dir), "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "use_dora": False,
    }))
    return out
