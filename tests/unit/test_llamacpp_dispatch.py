"""Choosing llama.cpp's CPU variant in a portable build (the image's): by what runs.

The stand-in variants are real shared libraries compiled here: each has the score a
variant reports, and `ggml_backend_init` (what llama.cpp calls on load) either returns or
executes an illegal instruction, as the AMX variant did on a host that lists AMX, grants
the tile state, and still faults on the instructions.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tokenq.shared.llamacpp_dispatch import (
    INCONCLUSIVE,
    PIN_ENV,
    Probe,
    VerdictCache,
    choose,
    load_cpu_backend,
)

SCORES = {"x64": 1, "haswell": 30, "skylakex": 50, "sapphirerapids": 90, "zen4": 0}
VARIANTS = [Path(f"/lib/libggml-cpu-{v}.so") for v in SCORES]


def score(path: Path) -> int:
    return SCORES[path.name.removeprefix("libggml-cpu-").removesuffix(".so")]


def runs(_: Path) -> str | None:
    return None


def test_the_best_variant_that_runs_is_chosen() -> None:
    assert choose(VARIANTS, score, amx_ok=True, probe=runs).path == Path(
        "/lib/libggml-cpu-sapphirerapids.so")


def test_amx_variant_is_passed_over_when_linux_refuses_amx() -> None:
    got = choose(VARIANTS, score, amx_ok=False, probe=runs)
    assert got.path == Path("/lib/libggml-cpu-skylakex.so")
    assert "sapphirerapids: Linux refused the AMX tile state" in got.describe()


def test_no_runnable_variant_is_none() -> None:
    assert choose(VARIANTS, lambda _: 0, amx_ok=True, probe=runs).path is None


def test_without_a_probe_unverified_amx_is_never_taken(tmp_path: Path) -> None:
    """The API's vocab-only loads compute nothing: they probe nothing, and take AMX only
    once a worker's probe verified it on this host."""
    cache = VerdictCache(tmp_path / "v.json", host="h")
    assert choose(VARIANTS, score, amx_ok=True, probe=None, cache=cache).path == Path(
        "/lib/libggml-cpu-skylakex.so")
    cache.put(Path("/lib/libggml-cpu-sapphirerapids.so"), "")
    assert choose(VARIANTS, score, amx_ok=True, probe=None, cache=cache).path == Path(
        "/lib/libggml-cpu-sapphirerapids.so")


def test_pinned_variant_wins_and_an_unknown_pin_is_refused() -> None:
    got = choose(VARIANTS, score, amx_ok=True, probe=runs, pinned="haswell")
    assert got.path == Path("/lib/libggml-cpu-haswell.so") and PIN_ENV in got.describe()
    with pytest.raises(RuntimeError, match="avx9"):
        choose(VARIANTS, score, amx_ok=True, probe=runs, pinned="avx9")


def test_fixed_flags_build_has_nothing_to_load(tmp_path: Path) -> None:
    (tmp_path / "libllama.so").write_bytes(b"")
    assert load_cpu_backend(tmp_path) is None


# -- stand-in libraries, a real child process, a real SIGILL ---------------------------

STAND_IN = """
int ggml_backend_score(void) { return SCORE; }
void *ggml_backend_init(void) { if (TRAP) __builtin_trap(); return (void *)0; }
"""


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler (the llama.cpp build needs one too)"
    out = tmp_path_factory.mktemp("variants")
    made = {}
    for name, sc, trap in (("sapphirerapids", 90, 1), ("skylakex", 50, 0), ("x64", 1, 0)):
        src = out / f"{name}.c"
        src.write_text(STAND_IN.replace("SCORE", str(sc)).replace("TRAP", str(trap)))
        lib = out / f"libggml-cpu-{name}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True)
        made[name] = lib
    return made


def child_init(counter: list[str]) -> Probe:
    """A probe that calls the stand-in's ggml_backend_init in a child process, as the real
    probe has llama.cpp do; it counts its runs."""

    def probe(variant: Path) -> str | None:
        counter.append(variant.name)
        code = "import ctypes, sys; ctypes.CDLL(sys.argv[1]).ggml_backend_init()"
        rc = subprocess.run([sys.executable, "-c", code, str(variant)], check=False,
                            capture_output=True).returncode
        return None if rc == 0 else f"exit {rc}"

    return probe


def lib_score(path: Path) -> int:
    import ctypes

    return int(ctypes.CDLL(str(path)).ggml_backend_score())


def test_a_variant_that_dies_in_the_probe_is_passed_over_and_cached(
        stand_ins: dict[str, Path], tmp_path: Path) -> None:
    cache = VerdictCache(tmp_path / "state" / "variants.json")
    runs_: list[str] = []
    got = choose(stand_ins.values(), lib_score, amx_ok=True, probe=child_init(runs_),
                 cache=cache)
    assert got.path == stand_ins["skylakex"], got.describe()
    assert got.passed_over == {"sapphirerapids": "exit -4"}  # SIGILL, in the child only
    assert runs_ == ["libggml-cpu-sapphirerapids.so", "libggml-cpu-skylakex.so"]
    # a second start on this host: the verdicts are read, nothing is probed again
    again: list[str] = []
    got = choose(stand_ins.values(), lib_score, amx_ok=True, probe=child_init(again),
                 cache=VerdictCache(tmp_path / "state" / "variants.json"))
    assert got.path == stand_ins["skylakex"] and again == []
    assert "verified on this host before" in got.describe()
    # another host (CPU, flags or kernel differ): probed afresh
    other: list[str] = []
    choose(stand_ins.values(), lib_score, amx_ok=True, probe=child_init(other),
           cache=VerdictCache(tmp_path / "state" / "variants.json", host="other"))
    assert len(other) == 2


def test_the_real_child_probe_reports_the_signal(stand_ins: dict[str, Path],
                                                 tmp_path: Path) -> None:
    """The worker's own probe (llamacpp_probe.py in a child): llama.cpp's loader calls the
    stand-in's init, which dies with SIGILL; the parent names the signal and lives on."""
    pytest.importorskip("llama_cpp")
    from tokenq.shared.llamacpp_dispatch import child_probe

    gguf = tmp_path / "unused.gguf"
    verdict = child_probe(gguf, timeout_s=120)(stand_ins["sapphirerapids"])
    assert verdict == "SIGILL in the probe"
    verdict = child_probe(gguf, timeout_s=120)(stand_ins["skylakex"])
    assert verdict is not None and verdict.startswith(INCONCLUSIVE)
    assert "could not load its CPU backend" in verdict


def test_an_inconclusive_probe_takes_the_variant_and_caches_nothing(tmp_path: Path) -> None:
    """A probe that fails without a signal (the model cannot be decoded, a busy machine)
    says nothing about the variant: the variant is taken, the model's own load then says
    what is wrong, and no verdict poisons the cache for the next start."""
    cache = VerdictCache(tmp_path / "v.json", host="h")
    got = choose(VARIANTS, score, amx_ok=True, cache=cache,
                 probe=lambda _: f"{INCONCLUSIVE}exit 1: llama_decode failed")
    assert got.path == Path("/lib/libggml-cpu-sapphirerapids.so")
    assert INCONCLUSIVE in got.describe()
    assert cache.get(Path("/lib/libggml-cpu-sapphirerapids.so")) is None


def test_worker_log_names_the_variant_and_those_passed_over(
        stand_ins: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tokenq.shared.llamacpp_dispatch as d

    lib = tmp_path / "lib"
    lib.mkdir()
    for p in stand_ins.values():
        os.symlink(p, lib / p.name)
    loaded: list[Path] = []
    monkeypatch.setattr(d, "load_variant", lambda _dir, path: loaded.append(path))
    monkeypatch.setattr(d, "_allow_amx", lambda: True)
    monkeypatch.setattr(d, "child_probe", lambda _model: child_init([]))
    monkeypatch.delenv(PIN_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="tokenq.workers.engines.llamacpp"):
        assert load_cpu_backend(lib, tmp_path / "m.gguf", tmp_path / "state") == "skylakex"
    assert loaded == [lib / "libggml-cpu-skylakex.so"]
    line = next(r.getMessage() for r in caplog.records if "CPU backend" in r.getMessage())
    assert "skylakex" in line and "sapphirerapids: exit -4" in line, line
    monkeypatch.setenv(PIN_ENV, "x64")
    assert load_cpu_backend(lib, tmp_path / "m.gguf", tmp_path / "state") == "x64"
