"""A GGUF model's vocabulary (tokenizer, chat template) and llama.cpp's backend start-up.

Both sides use it: the llama.cpp engine (workers/engines/llamacpp.py) tokenizes and
detokenizes with it, and the API loads it with vocab_only to count prompt tokens
without loading weights (api/tokens.py). With the engine's modules, the only place
that imports llama_cpp; nothing imports this module at start-up, only when a
vocabulary is loaded.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import llama_cpp as ll

from tokenq.shared.chat import ChatRenderer
from tokenq.shared.llamacpp_dispatch import load_cpu_backend
from tokenq.shared.settings import ModelConfig, get_settings
from tokenq.shared.vocab_cuts import CHUNK_CHARS, Cuts

log = logging.getLogger("tokenq.workers.engines.llamacpp")  # llama.cpp's own log lines


_ABORTED = (b"failed to decode, ret = 2", b"compute status: 1", b"failed with error 1")


@ll.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # noqa: ARG001
    # GGML_LOG_LEVEL_ERROR, but not the lines of a step stopped on purpose
    # (workers/engines/llamacpp_context.StepAbort)
    if level == 4 and not text.rstrip().endswith(_ABORTED):
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())


_SLICE = 8192  # token ids copied to Python per hold of the GIL
_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend(probe_model: Path | None) -> None:
    """llama.cpp's backend, once per process. A portable build's CPU variant is chosen
    by what runs: a process that computes probes with its own model (`probe_model`)."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))  # module-level ref keeps it alive
            ll.llama_backend_init()
            load_cpu_backend(Path(ll.__file__).parent / "lib", probe_model,
                             get_settings().state_dir)
            _backend_ready = True


class Vocab(ChatRenderer):
    """Tokenizer and chat template of a GGUF; `vocab_only` loads no weights (for the API)."""

    def __init__(self, path: Path, cfg: ModelConfig, *, vocab_only: bool, n_gpu_layers: int = 0):
        # the probe decodes a prompt: a chat model's worker probes, not an embedding one's
        _init_backend(None if vocab_only or cfg.embedding else path)
        params = ll.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = n_gpu_layers
        model = ll.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        # A vocab_only load has no hyperparameters: read the size from the metadata.
        self.n_embd = int(ll.llama_model_n_embd(model)) or int(
            self._meta(f"{self._meta('general.architecture')}.embedding_length") or 0)
        self._pieces: dict[int, bytes] = {}
        self._lp_pieces: dict[int, bytes] = {}
        tmpl = ll.llama_model_chat_template(model, None)
        self.chat_template = cfg.chat_template or (tmpl.decode() if tmpl else None)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self._text(ll.llama_vocab_bos(self.vocab))
        self.eos_text = self._text(ll.llama_vocab_eos(self.vocab))
        self.cuts = self._cut_points()

    def _meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(128)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    def _text(self, tok: int) -> str:
        if tok < 0:
            return ""
        raw = ll.llama_vocab_get_text(self.vocab, tok)
        return raw.decode(errors="replace") if raw else ""

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        # A template that writes the BOS text itself must not get a second BOS.
        add_special = add_special and self.add_bos and not (
            self.bos_text and text.startswith(self.bos_text))
        if len(text) <= CHUNK_CHARS or self.cuts is None:
            return self._tokenize(text, add_special)
        out: list[int] = []
        for i, piece in enumerate(self.cuts.pieces(text)):  # linear: vocab_cuts.py
            out += self._tokenize(piece, add_special and i == 0)
        return out

    def _cuttable(self) -> bool:
        """Whether tokenizing in pieces is exact here: SentencePiece and BPE vocabularies
        that add nothing at the end (no EOS, no SEP)."""
        return ll.llama_vocab_type(self.vocab) in (ll.LLAMA_VOCAB_TYPE_SPM,
                                                  ll.LLAMA_VOCAB_TYPE_BPE) and not (
            ll.llama_vocab_get_add_eos(self.vocab) or ll.llama_vocab_get_add_sep(self.vocab))

    def _cut_points(self) -> Cuts | None:
        """Where this vocabulary's long texts are cut (None: never). Reads every token's
        attributes: 0.07 s on SmolLM2's 49k, 0.44 s on Gemma 3's 262k, paid with the load
        rather than by the first long prompt (on a worker, a stall of every stream)."""
        if not self._cuttable():
            return None
        special = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_USER_DEFINED | \
            ll.LLAMA_TOKEN_ATTR_UNKNOWN
        attrs = [(t, ll.llama_vocab_get_attr(self.vocab, t)) for t in range(self.n_vocab)]
        specials = [(self._text(t), bool(a & ll.LLAMA_TOKEN_ATTR_LSTRIP))
                    for t, a in attrs if a & special]
        marks = self.chat_template or ""
        return Cuts(specials, [self.bos_text, self.eos_text, *(
            text for text, _ in specials if text and text in marks)])

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        data = text.encode()
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, True)
        if n < 0:
            buf = (ll.llama_token * (-n))()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, True)
        # Copied out a slice at a time: a 1 MB prompt's 200,000 ids in one copy would hold
        # the GIL for milliseconds on end (the API tokenizes on threads beside its loop).
        out: list[int] = []
        for i in range(0, n, _SLICE):
            out += buf[i:min(i + _SLICE, n)]
        return out

    def piece(self, tok: int) -> bytes:
        """A token's bytes (cached: this runs for every generated token)."""
        cached = self._pieces.get(tok)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, tok, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, tok, buf, -n, 0, False)
        self._pieces[tok] = buf.raw[:n]
        return self._pieces[tok]

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids -> text (special tokens as their text, as vLLM's /detokenize does)."""
        if any(t < 0 or t >= self.n_vocab for t in tokens):
            raise ValueError(f"token ids are in [0, {self.n_vocab})")
        return b"".join(self._special_piece(t) for t in tokens).decode(errors="replace")

    def logprob_piece(self, tok: int) -> bytes:
        """A token's bytes as logprobs show it: a special token (`<|im_end|>`) as its text,
        as vLLM shows it, where `piece` (the generated text's) has it empty (cached)."""
        cached = self._lp_pieces.get(tok)
        if cached is None:
            cached = self._lp_pieces[tok] = self._special_piece(tok)
        return cached

    def _special_piece(self, tok: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = ll.llama_token_to_piece(self.vocab, tok, buf, 64, 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, tok, buf, -n, 0, True)
        return buf.raw[:n]

    def is_eog(self, tok: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, tok))

    def close(self) -> None:
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None
