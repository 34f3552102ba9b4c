"""Loading llama.cpp's CPU backend in a portable build: the best variant that *runs* here.

A portable build (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS, scripts/llama_portable.sh, the
production image) ships the CPU backend once per x86-64 level (x64, SSE4.2, Haswell, …,
Sapphire Rapids, Zen 4) as its own library, and nothing is loaded until someone asks. Each
variant reports how well it fits this CPU (`ggml_backend_score`, from CPUID; 0 = cannot
run). CPUID is not enough: a hypervisor may list the AMX bits and Linux may grant the
tile state while the tile instructions still fault, and the Sapphire Rapids variant then
dies with SIGILL on its first matmul. So a worker tries the candidates, best score first,
each in a child process on a real decode of its own model (llamacpp_probe.py), and loads
the first that survives. Verdicts are cached per host (CPU model, flags, kernel, the
variant's file) in the state dir, so the probe costs once per host.

`TOKENQ_LLAMA_CPU_VARIANT` pins a variant by name (e.g. `zen4`), probe skipped. A process
that computes nothing (the API's vocab-only loads) probes nothing: it takes the best
variant already verified, else the best one outside the AMX family.
A build for fixed flags (scripts/setup.sh) links its backend in: nothing to do.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("tokenq.workers.engines.llamacpp")

AMX_VARIANTS = frozenset({"sapphirerapids"})
PIN_ENV = "TOKENQ_LLAMA_CPU_VARIANT"
PROBE_TIMEOUT_S = 180.0
CACHE_NAME = "llama-cpu-variants.json"

Probe = Callable[[Path], str | None]  # a variant -> None if it ran, else why not
# A probe's answer that says nothing about the variant (it is taken, nothing is cached):
# only a signal (SIGILL, SIGSEGV, ...) in the child rules a variant out.
INCONCLUSIVE = "probe inconclusive: "


def variant_of(path: Path) -> str:
    return path.name.removeprefix("libggml-cpu-").removesuffix(".so")


@dataclass
class Choice:
    """The variant chosen and why each better-scoring one was passed over."""

    path: Path | None
    passed_over: dict[str, str] = field(default_factory=dict)
    probed: bool = False
    note: str = ""

    def describe(self) -> str:
        name = variant_of(self.path) if self.path else "none"
        why = "; ".join(f"{v}: {reason}" for v, reason in self.passed_over.items())
        notes = [n for n in (self.note, f"passed over {why}" if why else "") if n]
        return name + (f" ({'; '.join(notes)})" if notes else "")


def candidates(variants: Iterable[Path], score: Callable[[Path], int]) -> list[Path]:
    """The variants this CPU can run by CPUID, best score first."""
    scored = [(score(p), p) for p in sorted(variants)]
    return [p for s, p in sorted(scored, key=lambda sp: -sp[0]) if s > 0]


def choose(variants: Iterable[Path], score: Callable[[Path], int], *, amx_ok: bool,
           probe: Probe | None, cache: VerdictCache | None = None,
           pinned: str | None = None) -> Choice:
    """The first variant, best score first, that is allowed and ran (or ran before).

    `probe` None: nothing computes in this process; verified variants only, else the best
    outside the AMX family (unverified AMX is never taken)."""
    variants = list(variants)
    if pinned:
        for path in variants:
            if variant_of(path) == pinned:
                return Choice(path, note=f"pinned by {PIN_ENV}")
        names = ", ".join(sorted(variant_of(p) for p in variants))
        raise RuntimeError(f"{PIN_ENV}={pinned!r}: no such llama.cpp CPU variant ({names})")
    choice = Choice(None)
    for path in candidates(variants, score):
        name = variant_of(path)
        if name in AMX_VARIANTS and not amx_ok:
            choice.passed_over[name] = "Linux refused the AMX tile state"
            continue
        known = cache.get(path) if cache else None
        if known is None and probe is None:
            if name in AMX_VARIANTS:
                choice.passed_over[name] = "not verified on this host (no probe here)"
                continue
            choice.path = path
            return choice
        fresh = known is None
        if known is None:
            assert probe is not None
            known = probe(path) or ""
            choice.probed = True
            if known.startswith(INCONCLUSIVE):
                # not the variant's fault (a model that cannot be decoded, a machine too
                # busy): nothing cached, and the model's own load says what is wrong
                choice.path, choice.note = path, known
                return choice
            if cache:
                cache.put(path, known)
        if known == "":
            choice.path = path
            choice.note = "ran in the probe" if fresh else "verified on this host before"
            return choice
        choice.passed_over[name] = known
    return choice


class VerdictCache:
    """Probe verdicts per host in a JSON file: "" = ran, else why it did not."""

    def __init__(self, file: Path, host: str | None = None) -> None:
        self.file = file
        self.host = host if host is not None else host_key()

    def _key(self, path: Path) -> str:
        try:
            st = path.stat()
            ident = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            ident = "?"
        return f"{self.host}:{variant_of(path)}:{ident}"

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(
            data, dict) else {}

    def get(self, path: Path) -> str | None:
        return self._load().get(self._key(path))

    def put(self, path: Path, verdict: str) -> None:
        data = self._load()
        data[self._key(path)] = verdict
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, self.file)  # several workers may start at once: whole files only
        except OSError as e:
            log.warning("could not cache the llama.cpp CPU probe's verdict in %s: %s",
                        self.file, e)


def host_key() -> str:
    """CPU model + flags + kernel: a verdict holds while these stay the same."""
    model = flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    u = os.uname()
    raw = f"{model}|{flags}|{u.release}|{u.machine}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def child_probe(model_path: Path, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """A probe that decodes with `model_path` on the variant in a child process."""

    def probe(variant: Path) -> str | None:
        cmd = [sys.executable, "-m", f"{__package__}.llamacpp_probe", str(variant),
               str(model_path)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            return f"{INCONCLUSIVE}no answer within {timeout_s:.0f} s"
        if done.returncode == 0:
            return None
        if done.returncode < 0:
            try:
                name = signal.Signals(-done.returncode).name
            except ValueError:
                name = f"signal {-done.returncode}"
            return f"{name} in the probe"
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"{INCONCLUSIVE}exit {done.returncode}: {last[:200]}"

    return probe


def load_cpu_backend(lib_dir: Path, probe_model: Path | None = None,
                     state_dir: Path | None = None) -> str | None:
    """Load the best CPU variant in `lib_dir` that runs here; its name, or None for a
    fixed-flags build. `probe_model`: a GGUF to probe with (a worker's own model)."""
    variants = list(lib_dir.glob("libggml-cpu-*.so"))
    if not variants:
        return None
    cache = VerdictCache(state_dir / CACHE_NAME) if state_dir else None
    choice = choose(variants, _score, amx_ok=_allow_amx(),
                    probe=child_probe(probe_model) if probe_model else None, cache=cache,
                    pinned=os.environ.get(PIN_ENV) or None)
    if choice.path is None:
        raise RuntimeError(f"no llama.cpp CPU backend in {lib_dir} runs on this CPU: "
                           f"{choice.describe()}")
    load_variant(lib_dir, choice.path)
    log.info("llama.cpp CPU backend: %s", choice.describe())
    return variant_of(choice.path)


def load_variant(lib_dir: Path, path: Path) -> None:
    # Through libllama's handle: dlsym then searches its dependencies, so the backend is
    # registered in the libggml copy libllama uses (the wheel holds libggml.so and
    # libggml.so.0 as two files).
    llama = ctypes.CDLL(str(lib_dir / "libllama.so"))
    llama.ggml_backend_load.argtypes = [ctypes.c_char_p]
    llama.ggml_backend_load.restype = ctypes.c_void_p
    if not llama.ggml_backend_load(str(path).encode()):
        raise RuntimeError(f"llama.cpp could not load its CPU backend {path}")


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
