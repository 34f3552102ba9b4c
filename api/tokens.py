"""Prompt token counting in the API, so a prompt longer than the context is a 400 at POST.

Loads only the GGUF's vocabulary (no weights, shared/vocab.py), off the event loop: the
API preloads the served models' vocabularies in the background at start-up (a large
vocabulary takes a noticeable part of a second, which the first request would otherwise
wait for). A long prompt is rendered and tokenized on the CPU pool (api/cpu.py), within
the tenant's share of it, never on the event loop. If
llama.cpp or the file is not available on the API host, it falls back to a
lower-bound estimate and the worker enforces the exact limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Protocol

from tokenq.api.cpu import CpuPool
from tokenq.shared.chat import ChatRenderer
from tokenq.shared.schemas import ChatMessage
from tokenq.shared.settings import ModelConfig, Settings
from tokenq.shared.weights import gguf_path

log = logging.getLogger(__name__)

# Prompts up to this long (a few short messages) are rendered and tokenized on the event
# loop: that is cheaper than the hop to a thread and back. Longer ones go to the CPU pool.
INLINE_CHARS = 1024
INLINE_MESSAGES = 8


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
        self.pool = CpuPool.from_settings(settings.api)
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
                    tools: list[dict[str, Any]] | None = None, *, tenant: str) -> int:
        """Prompt tokens after the chat template; raises ValueError if it cannot be rendered.
        A long prompt is counted on the CPU pool within `tenant`'s share (CpuPool.run: a
        429 when the tenant's queue there is full)."""
        if cfg.backend == "fake":
            from tokenq.shared.chat import count_tokens, prompt_text

            if light(prompt, messages, tools):
                return count_tokens(prompt_text(prompt, messages))
            return await self.pool.run(tenant, _fake_count, prompt, messages)
        vocab = await self._vocab(name, cfg)
        if vocab is None:
            text = prompt or "".join(str(m.get("content", "")) for m in messages or [])
            # a lower bound: never rejects a prompt that fits (and a text is a token or more)
            return -(-len(text.encode()) // 8)
        if light(prompt, messages, tools):
            return len(vocab.tokenize(vocab.render(prompt, messages, tools)))
        return await self.pool.run(tenant, _count, vocab, prompt, messages, tools)

    async def plain_messages(self, tenant: str, messages: list[ChatMessage] | None
                             ) -> list[dict[str, Any]] | None:
        """The messages as dicts, as templates take them; many are dumped on the CPU pool
        (30,000 one-letter messages, a 1 MB body, take ~100 ms)."""
        if messages is None or len(messages) <= INLINE_MESSAGES:
            return _dump(messages)
        return await self.pool.run(tenant, _dump, messages)


def light(prompt: str | None, messages: list[dict[str, Any]] | None,
          tools: list[dict[str, Any]] | None) -> bool:
    """Cheap enough to render and tokenize on the event loop."""
    if tools:
        return False
    if messages is None:
        return len(prompt or "") <= INLINE_CHARS
    if len(messages) > INLINE_MESSAGES:
        return False
    contents = [m.get("content") for m in messages]
    return all(isinstance(c, str | None) for c in contents) and sum(
        len(c or "") for c in contents) <= INLINE_CHARS


def _dump(messages: list[ChatMessage] | None) -> list[dict[str, Any]] | None:
    return None if messages is None else [m.model_dump() for m in messages]


def _count(vocab: _Vocab, prompt: str | None, messages: list[dict[str, Any]] | None,
           tools: list[dict[str, Any]] | None) -> int:
    return len(vocab.tokenize(vocab.render(prompt, messages, tools)))


def _fake_count(prompt: str | None, messages: list[dict[str, Any]] | None) -> int:
    from tokenq.shared.chat import count_tokens, prompt_text

    return count_tokens(prompt_text(prompt, messages))


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
