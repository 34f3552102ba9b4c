#!/usr/bin/env bash
# What `make test-cluster` needs on the host: a Docker engine (Debian's docker.io, started
# here if nothing runs it), docker-compose and debootstrap (the offline base image).
set -euo pipefail
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  echo "starting dockerd (log: /var/log/tokenq-dockerd.log)"
  nohup dockerd >/var/log/tokenq-dockerd.log 2>&1 &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/tokenq-dockerd.log; exit 1; }
fi
echo "docker: $(docker version -f '{{.Server.Version}}'), $(docker-compose version --short)"
