#!/usr/bin/env bash
# Build the Debian bookworm base image that the offline image builds start from, without a
# container registry: debootstrap a minimal root file system from Debian's packages, then
# `docker import` it. It carries what the cluster's services run on: Python 3.11 (tokenq),
# libgomp (llama.cpp's OpenMP), redis-server + redis-sentinel, prometheus and nginx.
# Idempotent: an image that exists already is kept (--force rebuilds).
#   scripts/base_image.sh [--force]      -> image tokenq/debian-base:bookworm
set -euo pipefail
IMAGE=${TOKENQ_BASE_IMAGE:-tokenq/debian-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-$(awk '/^deb .*debian.*bookworm /{print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)}
MIRROR=${MIRROR:-$(grep -h -m1 -oP '^URIs:\s*\K\S+' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
PACKAGES=python3,passwd,python3-venv,libgomp1,ca-certificates,redis-server,redis-sentinel,redis-tools,prometheus,nginx-light,procps,iproute2,wget

if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"; exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
root=$(mktemp -d /tmp/tokenq-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "debootstrap bookworm ($MIRROR) into $root"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >/tmp/tokenq-debootstrap.log 2>&1 \
  || { tail -20 /tmp/tokenq-debootstrap.log; exit 1; }
# The services start in the foreground under the container runtime, never through init.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/*
tar -C "$root" -c . | docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c 'CMD ["/bin/bash"]' - "$IMAGE"
echo "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | numfmt --to=iec))"
