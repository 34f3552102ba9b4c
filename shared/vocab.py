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
import os
import threading
from pathlib import Path
from typing import Any

import llama_cpp as ll

from shared.chat import render_chat
from shared.settings import ModelConfig

log = logging.getLogger("workers.engines.llamacpp")  # llama.cpp's own log lines


@ll.llama_log_callback  # type: ignore[untyped-decorator]
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # noqa: ARG001
    if level == 4:  # GGML_LOG_LEVEL_ERROR
        log.error("llama.cpp: %s", text.decode(errors="replace").rstrip())


_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            ll.llama_log_set(_quiet_log, ctypes.c_void_p(0))  # module-level ref keeps it alive
            ll.llama_backend_init()
            _load_cpu_backends()
            _backend_ready = True


def _load_cpu_backends() -> None:
    """A portable build (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, scripts/wheelhouse.sh)
    ships the CPU backend once per x86-64 level as its own library: load the best one this
    CPU supports. A build for fixed flags (scripts/setup.sh) links its backend in: no-op."""
    lib_dir = Path(ll.__file__).parent / "lib"
    if not any(lib_dir.glob("libggml-cpu-*.so")):
        return
    _allow_amx()
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
    ggml.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load_all_from_path(str(lib_dir).encode())
    ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
    if ggml.ggml_backend_reg_count() == 0:
        raise RuntimeError(f"no llama.cpp CPU backend in {lib_dir} runs on this CPU")


def _allow_amx() -> None:
    """Linux hands out the AMX tile state only on request (arch_prctl); the variant chosen
    for a CPU with AMX uses it. Fails harmlessly where there is no AMX."""
    if os.uname().machine != "x86_64":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)


class Vocab:
    """Tokenizer and chat template of a GGUF; `vocab_only` loads no weights (for the API)."""

    def __init__(self, path: Path, cfg: ModelConfig, *, vocab_only: bool, n_gpu_layers: int = 0):
        _init_backend()
        params = ll.llama_model_default_params()
        params.vocab_only = vocab_only
        params.n_gpu_layers = n_gpu_layers
        model = ll.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.model = model
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self._pieces: dict[int, bytes] = {}
        tmpl = ll.llama_model_chat_template(model, None)
        self.chat_template = cfg.chat_template or (tmpl.decode() if tmpl else None)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.bos_text = self._text(ll.llama_vocab_bos(self.vocab))
        self.eos_text = self._text(ll.llama_vocab_eos(self.vocab))

    def _text(self, tok: int) -> str:
        if tok < 0:
            return ""
        raw = ll.llama_vocab_get_text(self.vocab, tok)
        return raw.decode(errors="replace") if raw else ""

    def render(self, prompt: str | None, messages: list[dict[str, Any]] | None) -> str:
        if messages is None:
            return prompt or ""
        return render_chat(self.chat_template, messages, self.bos_text, self.eos_text)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        # A template that writes the BOS text itself must not get a second BOS.
        add_special = self.add_bos and not (self.bos_text and text.startswith(self.bos_text))
        buf = (ll.llama_token * (len(data) + 8))()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, True)
        if n < 0:
            buf = (ll.llama_token * (-n))()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, True)
        return list(buf[:n])

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

    def is_eog(self, tok: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, tok))

    def close(self) -> None:
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None
