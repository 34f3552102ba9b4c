"""Prompt token counting in the API, so a prompt longer than the context is a 400 at POST.

Loads only the GGUF's vocabulary (no weights, shared/vocab.py), off the event loop: the
API preloads the served models' vocabularies in the background at start-up (a large
vocabulary takes a noticeable part of a second, which the first request would otherwise
wait for). If
llama.cpp or the file is not available on the API host, it falls back to a
lower-bound estimate and the worker enforces the exact limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from tokenq.shared.chat import ChatRenderer
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path

log = logging.getLogger(__name__)

# Texts up to this long are tokenized on the event loop: that is cheaper than the hop to
# a thread and back. Longer ones go to a thread, so the loop never blocks for long.
INLINE_CHARS = 1024


class _Vocab(Protocol):
    n_vocab: int

    chat_template: str | None

    def render(self, prompt: str | None, messages: list[dict[str, Any]] | None,
               tools: list[dict[str, Any]] | None = None) -> str: ...
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...


class PromptCounter:
    def __init__(self, settings: Settings):
        self._settings = settings
        self._vocabs: dict[str, _Vocab | None] = {}
        self._lock = asyncio.Lock()

    async def _vocab(self, name: str, cfg: ModelConfig) -> _Vocab | None:
        if name not in self._vocabs:
            async with self._lock:
                if name not in self._vocabs:
                    self._vocabs[name] = await asyncio.to_thread(self._load, cfg)
        return self._vocabs[name]

    async def preload(self, models: dict[str, ModelConfig]) -> None:
        """Load every model's vocabulary now, one at a time, so no request waits for one."""
        for name, cfg in models.items():
            if cfg.backend != "fake":
                await self._vocab(name, cfg)

    def loaded(self) -> dict[str, bool]:
        """Models whose vocabulary was looked for: True where exact counting is available."""
        return {name: v is not None for name, v in self._vocabs.items()}

    def _load(self, cfg: ModelConfig) -> _Vocab | None:
        try:
            if cfg.source == "hf":  # a vLLM-only folder: its own Hugging Face tokenizer
                return HfVocab(Path(cfg.path or ""), cfg)
            from tokenq.shared.vocab import Vocab

            return Vocab(gguf_path(cfg, self._settings.state_dir), cfg, vocab_only=True)
        except Exception as exc:  # no llama.cpp or no file here: estimate instead
            log.warning("exact prompt counting unavailable (%s); estimating", exc)
            return None

    async def n_vocab(self, name: str, cfg: ModelConfig) -> int | None:
        """The vocabulary size where the tokenizer is loaded here (None: unknown)."""
        if cfg.backend == "fake":
            return None
        vocab = await self._vocab(name, cfg)
        return vocab.n_vocab if vocab is not None else None

    async def exact(self, name: str, cfg: ModelConfig) -> _Vocab:
        """The model's tokenizer; raises LookupError where this API host has none."""
        vocab = None if cfg.backend == "fake" else await self._vocab(name, cfg)
        if vocab is None:
            raise LookupError("this API host has no tokenizer for the model")
        return vocab

    async def count(self, name: str, cfg: ModelConfig, prompt: str | None,
                    messages: list[dict[str, Any]] | None,
                    tools: list[dict[str, Any]] | None = None) -> int:
        """Prompt tokens after the chat template; raises ValueError if it cannot be rendered."""
        if cfg.backend == "fake":
            from tokenq.shared.chat import count_tokens, prompt_text

            return count_tokens(prompt_text(prompt, messages))
        vocab = await self._vocab(name, cfg)
        if vocab is None:
            text = prompt or "".join(str(m.get("content", "")) for m in messages or [])
            return len(text.encode()) // 8  # a lower bound: never rejects a prompt that fits
        rendered = vocab.render(prompt, messages, tools)
        if len(rendered) <= INLINE_CHARS:
            return len(vocab.tokenize(rendered))
        return len(await asyncio.to_thread(vocab.tokenize, rendered))


class HfVocab(ChatRenderer):
    """A Hugging Face folder's tokenizer (transformers, present where vLLM is), with the
    same surface and the same BOS rule as the GGUF vocabulary."""

    def __init__(self, path: Path, cfg: ModelConfig):
        from transformers import AutoTokenizer

        self.tok: Any = AutoTokenizer.from_pretrained(str(path))
        self.n_vocab = len(self.tok)
        config = json.loads((path / "config.json").read_text())
        self.n_embd = int(config.get("hidden_size") or config.get("d_model") or 0)
        self.chat_template = cfg.chat_template or self.tok.chat_template
        self.bos_text = self.tok.bos_token or ""
        self.eos_text = self.tok.eos_token or ""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        special = add_special and not (self.bos_text and text.startswith(self.bos_text))
        return list(self.tok.encode(text, add_special_tokens=special))

    def detokenize(self, tokens: list[int]) -> str:
        if any(t < 0 or t >= self.n_vocab for t in tokens):
            raise ValueError(f"token ids are in [0, {self.n_vocab})")
        return str(self.tok.decode(tokens))
