"""A long text is tokenized in pieces cut before special tokens (shared/vocab_cuts.py): the
pieces give exactly the whole's tokens on both real vocabularies, and a long chat is cut.

Before, llama.cpp was handed the whole text: 29,000 one-letter messages (1 MB) took 15 s
on SmolLM2's vocabulary and a 1 MB prompt of short lines 94 s on Gemma 3's, one tenant's
request burning the API's CPU pool."""

from __future__ import annotations

import random
from collections.abc import Iterator

import llama_cpp as ll
import pytest

from tokenq.shared.vocab import Vocab
from tokenq.shared.vocab_cuts import Cuts

MODELS = ["smollm2-135m-instruct", "gemma3-270m"]


@pytest.fixture(scope="module", params=MODELS)
def vocab(request: pytest.FixtureRequest) -> Iterator[Vocab]:
    from tokenq.shared.settings import get_settings
    from tokenq.shared.weights import gguf_path

    s = get_settings()
    cfg = s.models()[request.param]
    v = Vocab(gguf_path(cfg, s.state_dir), cfg, vocab_only=True)
    yield v
    v.close()


def _whole(v: Vocab, text: str) -> list[int]:
    """llama.cpp's tokens for the text in one call, as before the cuts."""
    add = v.add_bos and not (v.bos_text and text.startswith(v.bos_text))
    return v._tokenize(text, add)


def _small_cuts(v: Vocab, chunk: int) -> Cuts:
    big = v.cuts
    assert big is not None
    small = Cuts([], [], chunk)
    small.danger, small.any_lstrip, small._find = big.danger, big.any_lstrip, big._find
    return small


def _chat(v: Vocab, n: int, seed: int) -> str:
    rng = random.Random(seed)
    words = ["a", "hello", " ", "\n", "\n\n", "  x", "é", "日本", "<", "|>", "\t"]
    msgs = [{"role": ("user", "assistant")[i % 2],
             "content": "".join(rng.choice(words) for _ in range(rng.randint(0, 6)))}
            for i in range(n)]
    return v.render(None, msgs)


def _hostile(v: Vocab, seed: int) -> str:
    """Special texts, their halves and blanks run together: overlaps at every cut."""
    rng = random.Random(seed)
    assert v.cuts is not None
    marks = [*v.cuts.danger, "<unused0>", "<|endoftext|>", "<end_of_turn>"]
    parts = [*marks, *(m[: len(m) // 2] for m in marks), *(m[len(m) // 2:] for m in marks),
             "\n", "\n\n", " ", "  ", "a", "b c", "<", ">", "|"]
    return "".join(rng.choice(parts) for _ in range(rng.randint(50, 400)))


def test_a_chat_has_cut_points(vocab: Vocab) -> None:
    assert vocab.cuts is not None
    assert vocab.cuts.danger, "the template's markers are where a chat text is cut"


@pytest.mark.parametrize("seed", range(40))
def test_pieces_tokenize_to_the_whole(vocab: Vocab, seed: int) -> None:
    text = _chat(vocab, 30, seed) if seed % 2 else _hostile(vocab, seed)
    cuts = _small_cuts(vocab, chunk=1 + seed % 7)
    pieces = list(cuts.pieces(text))
    assert "".join(pieces) == text
    add = vocab.add_bos and not (vocab.bos_text and text.startswith(vocab.bos_text))
    got: list[int] = []
    for i, piece in enumerate(pieces):
        got += vocab._tokenize(piece, add and i == 0)
    assert got == _whole(vocab, text)


def test_a_long_chat_goes_to_llama_cpp_in_pieces(vocab: Vocab,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    text = _chat(vocab, 3000, 1)
    expected = _whole(vocab, text)
    longest: list[int] = []
    real = ll.llama_tokenize

    def spy(vocab_p: object, data: bytes, n: int, *rest: object) -> int:
        longest.append(n)
        return int(real(vocab_p, data, n, *rest))

    monkeypatch.setattr(ll, "llama_tokenize", spy)
    assert vocab.tokenize(text) == expected
    assert len(longest) > 10 and max(longest) < 4 * 4096, (len(text), max(longest))
