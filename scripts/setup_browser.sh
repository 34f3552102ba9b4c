#!/usr/bin/env bash
# Headless Chromium for the playground's browser test (tests/e2e/test_playground.py):
# Debian's `chromium` and `chromium-driver`, installed once with apt (root or sudo).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
echo "installing chromium + chromium-driver (apt; once, for the playground's browser test)"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
