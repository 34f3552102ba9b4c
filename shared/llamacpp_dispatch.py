"""Loading llama.cpp's CPU backend in a portable build.

A portable build (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, scripts/wheelhouse.sh, the
production image) ships the CPU backend once per x86-64 level (x64, SSE4.2, Haswell, …,
Sapphire Rapids, Zen 4) as its own library, and nothing is loaded until someone asks. Here
each variant reports how well it fits this CPU (its `ggml_backend_score`, 0 = cannot run)
and the best is loaded — as ggml's own loader does, except that a variant built for AMX is
passed over when Linux refuses this process the AMX tile state (it would die with SIGILL).
A build for fixed flags (scripts/setup.sh) links its backend in: nothing to do.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger("workers.engines.llamacpp")

AMX_VARIANTS = frozenset({"sapphirerapids"})


def variant_of(path: Path) -> str:
    return path.name.removeprefix("libggml-cpu-").removesuffix(".so")


def choose(variants: Iterable[Path], score: Callable[[Path], int], amx_ok: bool) -> Path | None:
    """The variant with the highest score that this process may run; None if none can."""
    best, best_score = None, 0
    for path in sorted(variants):
        if variant_of(path) in AMX_VARIANTS and not amx_ok:
            continue
        s = score(path)
        if s > best_score:
            best, best_score = path, s
    return best


def load_cpu_backend(lib_dir: Path) -> str | None:
    """Load the best CPU variant in `lib_dir`; its name, or None for a fixed-flags build."""
    variants = list(lib_dir.glob("libggml-cpu-*.so"))
    if not variants:
        return None
    best = choose(variants, _score, amx_ok=_allow_amx())
    if best is None:
        raise RuntimeError(f"no llama.cpp CPU backend in {lib_dir} runs on this CPU")
    # Through libllama's handle: dlsym then searches its dependencies, so the backend is
    # registered in the libggml copy libllama uses (the wheel holds libggml.so and
    # libggml.so.0 as two files).
    llama = ctypes.CDLL(str(lib_dir / "libllama.so"))
    llama.ggml_backend_load.argtypes = [ctypes.c_char_p]
    llama.ggml_backend_load.restype = ctypes.c_void_p
    if not llama.ggml_backend_load(str(best).encode()):
        raise RuntimeError(f"llama.cpp could not load its CPU backend {best}")
    log.info("llama.cpp CPU backend: %s", variant_of(best))
    return variant_of(best)


def _score(path: Path) -> int:
    lib = ctypes.CDLL(str(path))
    lib.ggml_backend_score.restype = ctypes.c_int
    return int(lib.ggml_backend_score())


def _allow_amx() -> bool:
    """Linux hands out the AMX tile state only on request (arch_prctl); True if granted."""
    if os.uname().machine != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return int(libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)) == 0
