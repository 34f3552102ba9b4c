#!/usr/bin/env bash
# Build llama.cpp's C++ llama-server from the source vendored in the llama-cpp-python sdist
# (same version and CPU flags as the Python build) into ~/.cache/tokenq/llama-server/<key>/.
# Prints the binary's path. Used by `tokenq bench compare` as the practical upper bound
# (and, with --find, by `tokenq bench mixed`, which never builds it). Ships in the wheel
# (package data of tokenq.cli) beside llama_cmake_args.sh; needs cmake and a C++ compiler.
# PYTHON: the interpreter whose pip downloads the source (default: python3).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
LLAMA_VERSION=0.3.36
ARGS="$(bash "$HERE/llama_cmake_args.sh")"
KEY=$(printf '%s %s' "$LLAMA_VERSION" "$ARGS" | sha256sum | cut -c1-16)
OUT="${TOKENQ_CACHE:-$HOME/.cache/tokenq}/llama-server/$KEY"
if [ -x "$OUT/llama-server" ]; then echo "$OUT/llama-server"; exit 0; fi
# --find: only say where a built one is (exit 1 if none), never build
if [ "${1:-}" = "--find" ]; then exit 1; fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"${PYTHON:-python3}" -m pip download -q --no-binary :all: --no-deps -d "$WORK" \
  "llama-cpp-python==$LLAMA_VERSION" >&2
tar xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC=$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release $ARGS -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$OUT"
cp "$WORK/build/bin/llama-server" "$OUT/"
echo "$OUT/llama-server"
