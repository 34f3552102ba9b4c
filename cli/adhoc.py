"""`tokenq up -m PATH`: serve a GGUF file (llama.cpp) or a Hugging Face folder (vLLM)
without writing a models file. The entry is written to <state_dir>/models.adhoc.json
(over TOKENQ_MODELS_FILE's entries), which the API and workers then read."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenq.shared.settings import Settings, SettingsProblem


def model_name(path: Path) -> str:
    """SmolLM2-135M-Instruct-Q8_0.gguf -> smollm2-135m-instruct-q8_0."""
    stem = path.name.removesuffix(".gguf") if path.is_file() or path.suffix == ".gguf" \
        else path.name
    return re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-") or "model"


def entry_for(value: str) -> tuple[str, dict[str, str]] | None:
    """(name, registry entry) when `value` is a path to weights; None for a model name."""
    path = Path(value).expanduser()
    if value.endswith(".gguf"):
        if not path.is_file():
            raise SettingsProblem(f"--model {value}: no such GGUF file")
        return model_name(path), {"source": "file", "path": str(path.resolve())}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SettingsProblem(f"--model {value}: a folder must be a Hugging Face model "
                                  "folder (config.json and safetensors) for vLLM")
        return model_name(path), {"source": "hf", "backend": "vllm",
                                  "path": str(path.resolve())}
    return None


def resolve_models(values: list[str], settings: Settings) -> tuple[list[str], Settings]:
    """Model names for --model values, and the settings that make the paths servable."""
    names, extra = [], {}
    for v in values:
        found = entry_for(v)
        if found is None:
            names.append(v)
        else:
            names.append(found[0])
            extra[found[0]] = found[1]
    if not extra:
        return names, settings
    merged = json.loads(settings.models_file.read_text()) if settings.models_file else {}
    merged.update(extra)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    out = settings.state_dir / "models.adhoc.json"
    out.write_text(json.dumps(merged, indent=2))
    return names, settings.model_copy(update={"models_file": out})
