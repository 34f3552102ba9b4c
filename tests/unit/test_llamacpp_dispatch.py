"""Choosing llama.cpp's CPU variant in a portable build (the image's)."""

from __future__ import annotations

from pathlib import Path

from shared.llamacpp_dispatch import choose, load_cpu_backend

SCORES = {"x64": 1, "haswell": 30, "skylakex": 50, "sapphirerapids": 90, "zen4": 0}
VARIANTS = [Path(f"/lib/libggml-cpu-{v}.so") for v in SCORES]


def score(path: Path) -> int:
    return SCORES[path.name.removeprefix("libggml-cpu-").removesuffix(".so")]


def test_the_best_variant_this_cpu_runs_is_chosen() -> None:
    assert choose(VARIANTS, score, amx_ok=True) == Path("/lib/libggml-cpu-sapphirerapids.so")


def test_amx_variant_is_passed_over_when_linux_refuses_amx() -> None:
    assert choose(VARIANTS, score, amx_ok=False) == Path("/lib/libggml-cpu-skylakex.so")


def test_no_runnable_variant_is_none() -> None:
    assert choose(VARIANTS, lambda _: 0, amx_ok=True) is None


def test_fixed_flags_build_has_nothing_to_load(tmp_path: Path) -> None:
    (tmp_path / "libllama.so").write_bytes(b"")
    assert load_cpu_backend(tmp_path) is None
