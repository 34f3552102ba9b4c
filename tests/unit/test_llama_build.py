"""The llama-cpp-python builds (scripts/setup.sh, scripts/llama_portable.sh) leave out
llama.cpp's `common` library (scripts/llama_no_common.cmake): llama-cpp-python forces it
on, tokenq never loads it, and it is about half of the native build's time."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "scripts" / "llama_no_common.cmake"
FLAG = "-DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama_no_common.cmake"


def test_both_wheel_builds_pass_the_hook() -> None:
    for script in ("setup.sh", "llama_portable.sh"):
        assert FLAG in (ROOT / "scripts" / script).read_text(), script
    # llama-server's own build needs `common`: the CPU flags it shares carry no hook
    assert "llama_no_common" not in (ROOT / "cli" / "llama_cmake_args.sh").read_text()


@pytest.mark.skipif(shutil.which("cmake") is None, reason="no cmake")
def test_the_hook_wins_over_the_parents_forced_setting(tmp_path: Path) -> None:
    """llama-cpp-python's shape in miniature: its CMakeLists forces LLAMA_BUILD_COMMON on,
    then adds llama.cpp, whose project() runs the hook before llama.cpp reads the option."""
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.15)\nproject(llama_cpp NONE)\n"
        'set(LLAMA_BUILD_COMMON ON CACHE BOOL "forced" FORCE)\nadd_subdirectory(vendor)\n')
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "CMakeLists.txt").write_text(
        'project("llama.cpp" NONE)\noption(LLAMA_BUILD_COMMON "common" ON)\n'
        'message(STATUS "LLAMA_BUILD_COMMON=${LLAMA_BUILD_COMMON}")\n')
    out = subprocess.run(["cmake", "-S", str(tmp_path), "-B", str(tmp_path / "build"),
                          f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={HOOK}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "LLAMA_BUILD_COMMON=OFF" in out, out
