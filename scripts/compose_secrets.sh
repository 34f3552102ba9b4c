#!/usr/bin/env bash
# Secrets for compose/compose.yml: API keys (only their sha256 is stored), Prometheus' key
# (it reads the worker list from the API's /metrics/targets) and, in compose/.env, the Redis
# and Grafana passwords. Prints each new key once, as `tenant key`; keep them.
#   scripts/compose_secrets.sh [TENANT ...]     # always: ops (admin) and prometheus
# TOKENQ_SECRETS_DIR (default compose/secrets) and TOKENQ_ENV_FILE (default compose/.env)
# place the files elsewhere; an existing .env is kept. Add a tenant later with
#   echo "sha256:$(printf %s "$KEY" | sha256sum | cut -c1-64) TENANT" >> compose/secrets/api_keys
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${TOKENQ_SECRETS_DIR:-compose/secrets}
env_file=${TOKENQ_ENV_FILE:-compose/.env}
mkdir -p "$dir"
new_key() { python3 -c 'import secrets; print("tq-" + secrets.token_urlsafe(24))'; }
sha() { printf %s "$1" | sha256sum | cut -c1-64; }

: > "$dir/api_keys"
add() {  # tenant [role ...]
  local key; key=$(new_key)
  echo "sha256:$(sha "$key") $*" >> "$dir/api_keys"
  echo "$1 $key"
  [ "$1" != prometheus ] || printf %s "$key" > "$dir/prometheus_key"
}
add ops admin
add prometheus metrics  # the `metrics` role: /metrics and /metrics/targets (workers' addresses)
for tenant in "$@"; do add "$tenant"; done
# Bind-mounted as they are into containers that run as other users: readable, and only
# hashes besides Prometheus' own key.
chmod 0644 "$dir/api_keys" "$dir/prometheus_key"
if [ ! -e "$env_file" ]; then
  umask 077
  { echo "REDIS_PASSWORD=$(new_key)"; echo "GRAFANA_PASSWORD=$(new_key)"
    echo "REDIS_SENTINEL_PASSWORD=$(new_key)"; } > "$env_file"  # profile ha
fi
