"""Logprobs entries on llama.cpp: a special token (`<|im_end|>`) shows as its text, with
its UTF-8 bytes, as vLLM shows it, and never as "" (where two of them collided in the
completions' {token: logprob} dict); the generated text still renders it empty."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest

from tokenq.api.openai.protocol import completion_logprobs
from tokenq.shared.vocab import Vocab


@pytest.fixture(scope="module")
def vocab() -> Iterator[Vocab]:
    from tokenq.shared.settings import get_settings
    from tokenq.shared.weights import gguf_path

    s = get_settings()
    cfg = s.models()["smollm2-135m-instruct"]
    v = Vocab(gguf_path(cfg, s.state_dir), cfg, vocab_only=True)
    yield v
    v.close()


def test_special_tokens_show_as_their_text(vocab: Vocab,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenq.workers.engines import llamacpp_sampling

    end, start = vocab.tokenize("<|im_end|><|im_start|>", add_special=False)
    hello = vocab.tokenize("hello", add_special=False)[0]
    assert vocab.piece(end) == b""  # the generated text's rendering is unchanged
    logits = (ctypes.c_float * vocab.n_vocab)()
    logits[end], logits[start], logits[hello] = 9.0, 8.0, 7.0
    monkeypatch.setattr(llamacpp_sampling.ll, "llama_get_logits_ith",
                        lambda *_: ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)))
    entry = llamacpp_sampling.row_logprobs(None, vocab, 0, end, 3)
    assert entry["token"] == "<|im_end|>" and entry["bytes"] == list(b"<|im_end|>")
    top = entry["top_logprobs"]
    assert [t["token"] for t in top] == ["<|im_end|>", "<|im_start|>", "hello"]
    assert all(t["bytes"] == list(t["token"].encode()) for t in top)
    # completions' shape: one key per alternative, none lost to a collision on ""
    out = completion_logprobs([entry])
    assert out["tokens"] == ["<|im_end|>"] and len(out["top_logprobs"][0]) == 3
