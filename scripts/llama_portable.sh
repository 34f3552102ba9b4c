#!/usr/bin/env bash
# Build the portable llama-cpp-python wheel once and print its path. GGML_BACKEND_DL +
# GGML_CPU_ALL_VARIANTS compile the CPU backend once per x86-64 level (SSE4.2 ... AVX-512,
# AMX) and the worker loads the best one this CPU supports at start
# (shared/llamacpp_dispatch.py); a build with the build host's flags dies with SIGILL on
# an older CPU. The production image installs it (scripts/wheelhouse.sh); CI's test setup
# installs it too (TOKENQ_LLAMA_BUILD=portable scripts/setup.sh), so that one build
# (~9 min on 2 cores) serves the tests and the image.
# Cached in ~/.cache/tokenq/wheels/portable-<version>/ (TOKENQ_WHEEL_CACHE moves it).
#   scripts/llama_portable.sh      -> the repacked wheel's path (last line of stdout)
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=$(grep -oP '"llama-cpp-python==\K[0-9.]+' pyproject.toml)
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
CACHE="${TOKENQ_WHEEL_CACHE:-$HOME/.cache/tokenq/wheels}/portable-$LLAMA_VERSION"
ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DLLAVA_BUILD=OFF"
# Without llama.cpp's `common` library, which the wheel does not need (the file says why).
ARGS+=" -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama_no_common.cmake"

# A private venv for the pip that builds: the host's own may be older or externally managed.
venv=.tokenq/wheelhouse-venv
[ -x $venv/bin/python ] || "$PY" -m venv $venv
PIP=($venv/bin/python -m pip --disable-pip-version-check -q)
[ -x $venv/bin/wheel ] || "${PIP[@]}" install --upgrade pip wheel setuptools >&2

if ! ls "$CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building portable llama-cpp-python $LLAMA_VERSION (every x86-64 CPU variant; once)" >&2
  mkdir -p "$CACHE"
  CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "${PIP[@]}" wheel --no-deps --no-cache-dir -w "$CACHE" "llama-cpp-python==$LLAMA_VERSION" >&2
fi

# The build puts the CPU variants in the wheel's top-level bin/ (site-packages/bin once
# installed) and a second copy of the libraries in lib/: repack with the variants beside
# libggml.so in llama_cpp/lib, where the worker loads them from, and without the copies.
REPACKED="$CACHE/repacked"
if ! ls "$REPACKED"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  $venv/bin/python -m wheel unpack -d "$tmp" >/dev/null "$CACHE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
  pkg=("$tmp"/llama_cpp_python-*)
  mv "${pkg[0]}"/bin/libggml-cpu-*.so "${pkg[0]}"/llama_cpp/lib/
  rm -rf "${pkg[0]}"/bin "${pkg[0]}"/lib
  mkdir -p "$REPACKED"
  $venv/bin/python -m wheel pack -d "$REPACKED" "${pkg[0]}" >/dev/null
  rm -rf "$tmp"
fi
ls "$REPACKED"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
