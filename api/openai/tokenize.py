"""/tokenize and /detokenize in vLLM's shapes, and the context one job may use.

Both run in the API on the model's tokenizer (the GGUF vocabulary, or a Hugging Face
folder's tokenizer for a vLLM-only model), as vLLM's server does: no job, no worker. The
work (rendering, tokenizing, detokenizing, and the answer's JSON, which for a 1 MB prompt
holds 200,000 token ids) runs on the CPU pool in the tenant's share (api/cpu.py), never
on the event loop; the answer comes back as JSON bytes.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tokenq.api import lora_admin
from tokenq.api.deps import AppState
from tokenq.api.errors import InvalidRequest, ModelNotFound, Unavailable
from tokenq.api.openai.protocol import FalseIfNull, TrueIfNull
from tokenq.shared.schemas import ChatMessage
from tokenq.shared.settings import ModelConfig
from tokenq.shared.weights import select_backend

MAX_DETOKENIZE = 131072
IDS_SLICE = 8192


class TokenizeRequest(BaseModel):
    """vLLM's TokenizeCompletionRequest and TokenizeChatRequest in one: `prompt` or
    `messages` (rendered with the model's chat template)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: TrueIfNull = True
    add_generation_prompt: TrueIfNull = True
    return_token_strs: FalseIfNull = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE)


async def base_model(state: AppState, name: str, tenant: str) -> tuple[str, ModelConfig]:
    """The served model (or the base of an adapter `tenant` may use) named `name`."""
    cfg = state.models.get(name)
    if cfg is not None:
        return name, cfg
    found = await lora_admin.resolve(state, name, tenant)
    if found is None:
        raise ModelNotFound(f"model {name!r} is not served here", param="model")
    return found[0], state.models[found[0]]


async def context_length(state: AppState, name: str, cfg: ModelConfig) -> int:
    """Tokens one job may use: n_ctx / n_parallel on llama.cpp; on vLLM the configured
    max_model_len, else what a live worker's engine reports (the model's own limit)."""
    backend = select_backend(cfg)
    if backend != "vllm" or cfg.max_model_len is not None:
        return cfg.context_length(backend)
    seen = [hb.max_model_len for hb in (await state.live_workers()).values()
            if hb.model == name and hb.max_model_len]
    return min(seen) if seen else cfg.context_length(backend)


async def tokenize(state: AppState, tenant: str, body: TokenizeRequest) -> bytes:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequest("give exactly one of 'prompt' and 'messages'", param="prompt")
    name, cfg = await base_model(state, body.model, tenant)
    vocab = await _vocab(state, name, cfg)
    max_len = await context_length(state, name, cfg)
    return await state.counter.pool.run(tenant, _tokenize, vocab, body, max_len,
                                        state.settings.api.max_token_strs)


async def detokenize(state: AppState, tenant: str, body: DetokenizeRequest) -> bytes:
    name, cfg = await base_model(state, body.model, tenant)
    vocab = await _vocab(state, name, cfg)
    return await state.counter.pool.run(tenant, _detokenize, vocab, body.tokens)


def _tokenize(vocab: Any, body: TokenizeRequest, max_len: int, max_strs: int) -> bytes:
    messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
    try:
        text = vocab.render(body.prompt, messages)
    except Exception as exc:
        raise InvalidRequest(f"could not apply the chat template: {exc}",
                             param="messages") from exc
    tokens = vocab.tokenize(text, body.add_special_tokens)
    strs = None
    if body.return_token_strs:
        if max_strs and len(tokens) > max_strs:
            raise InvalidRequest(f"return_token_strs: the prompt has {len(tokens)} tokens; "
                                 f"their strings are given for at most {max_strs}",
                                 param="return_token_strs", code="too_many_token_strs")
        strs = [vocab.detokenize([t]) for t in tokens]
    head = _json({"count": len(tokens), "max_model_len": max_len})[:-1]
    return b"".join([head, b',"tokens":', _ids(tokens), b',"token_strs":', _json(strs), b"}"])


def _detokenize(vocab: Any, tokens: list[int]) -> bytes:
    try:
        return _json({"prompt": vocab.detokenize(tokens)})
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="tokens") from exc


def _json(body: Any) -> bytes:
    """As Starlette's JSONResponse renders it."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode()


def _ids(tokens: list[int]) -> bytes:
    """A JSON array of token ids, encoded a slice at a time: each slice is one short hold
    of the GIL, where the whole list (200,000 ids) would keep the event loop waiting."""
    parts = (_json(tokens[i:i + IDS_SLICE])[1:-1] for i in range(0, len(tokens), IDS_SLICE))
    return b"[" + b",".join(parts) + b"]"


async def _vocab(state: AppState, name: str, cfg: ModelConfig) -> Any:
    try:
        return await state.counter.exact(name, cfg)
    except LookupError as exc:
        raise Unavailable(f"{exc}; tokenize on a host that has it", code="no_tokenizer") from exc
