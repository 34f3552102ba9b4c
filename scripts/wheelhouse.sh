#!/usr/bin/env bash
# Make wheelhouse/: every wheel the production image installs (compose/Dockerfile), so that
# the image builds without a compiler or a network. Run on a Linux x86-64 host with
# Python 3.11 (the image's Python) and package registries.
#
# llama-cpp-python is the portable build (scripts/llama_portable.sh: every x86-64 CPU
# variant, the best one loaded at start), never the build host's flags.
#   scripts/wheelhouse.sh [EXTRAS]      # EXTRAS: the image's extra, default "cpu"
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS=${1:-cpu}
OUT=wheelhouse
PORTABLE=$(scripts/llama_portable.sh | tail -1)
venv=.tokenq/wheelhouse-venv  # made by llama_portable.sh
PIP=($venv/bin/python -m pip --disable-pip-version-check -q)

# build/ is setuptools' in-tree staging: a module since moved or deleted would ride along
rm -rf "$OUT" build && mkdir -p "$OUT"
cp "$PORTABLE" "$OUT"/
# tokenq itself and everything it needs; llama-cpp-python is taken from the portable wheel.
"${PIP[@]}" wheel -w "$OUT" --find-links "$OUT" ".[$EXTRAS]"
# Needed where the image's Python is older than this one (redis asks for it below 3.11.3;
# Debian bookworm has 3.11.2): pip only fetched what this host's Python needed.
"${PIP[@]}" wheel -w "$OUT" --no-deps "async-timeout>=4.0.3"
echo "wheelhouse: $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
