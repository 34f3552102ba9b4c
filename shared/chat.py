"""Chat templates: messages -> prompt text, with the model's own Jinja template; and the
fake backend's plain rendering and tokenizer, which its engine and the API share."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import Template
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Hugging Face's `tojson` for chat templates (Jinja's own sorts keys and escapes HTML):
    tool schemas and call arguments render as vLLM and transformers render them."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat(template: str | None, messages: list[dict[str, Any]], bos: str, eos: str,
                tools: list[dict[str, Any]] | None = None) -> str:
    """`tools` (OpenAI's list) is passed to templates that render tools themselves."""
    if not template:
        raise ValueError("this model has no chat template; send 'prompt' instead of 'messages'")
    return _compile(template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos,
        tools=tools,
    )


class ChatRenderer:
    """What a vocabulary needs to turn a request into prompt text: its chat template and
    the BOS/EOS texts the template may write."""

    chat_template: str | None
    bos_text: str
    eos_text: str

    def render(self, prompt: str | None, messages: list[dict[str, Any]] | None,
               tools: list[dict[str, Any]] | None = None) -> str:
        if messages is None:
            return prompt or ""
        return render_chat(self.chat_template, messages, self.bos_text, self.eos_text, tools)


def renders_tools(template: str | None) -> bool:
    """Whether a chat template renders `tools` itself (llama.cpp's test: it names them)."""
    return bool(template) and "tools" in (template or "")


def prompt_text(prompt: str | None, messages: list[dict[str, Any]] | None) -> str:
    if prompt is not None:
        return prompt
    return "\n".join(str(m.get("content", "")) for m in messages or [])


def count_tokens(text: str) -> int:
    """The fake tokenizer: one token per whitespace-separated word (API and engine agree)."""
    return max(1, len(text.split()))
