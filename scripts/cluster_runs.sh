#!/usr/bin/env bash
# Run the cluster suite N times in a row (each run brings the compose file up from scratch)
# and summarise the figures: the evidence behind docs/operations.md's cluster table.
#   scripts/cluster_runs.sh 10 [FIGURES.jsonl [TESTS]]  (after `make test-cluster` built the images)
# TESTS: what pytest runs each time (default tests/cluster; tests/cluster/test_ha.py: the
# Redis failover scenarios alone).
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-10}
out=${2:-.tokenq/cluster-figures.jsonl}
tests=${3:-tests/cluster}
mkdir -p "$(dirname "$out")"
: > "$out"
passed=0
for i in $(seq "$n"); do
  start=$(date +%s)
  if TOKENQ_CLUSTER_FIGURES="$out" .venv/bin/pytest "$tests" -q -p no:cacheprovider \
       >".tokenq/cluster-run-$i.log" 2>&1; then
    passed=$((passed + 1)); verdict=passed
  else
    verdict=FAILED
  fi
  echo "run $i: $verdict in $(( $(date +%s) - start )) s ($(tail -1 ".tokenq/cluster-run-$i.log"))"
done
echo "$passed of $n runs passed; figures: $out"
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
for name in sorted({k for r in runs for k in r}):
    rows = [r[name] for r in runs if name in r]
    cells = []
    for key in sorted({k for row in rows for k in row}):
        vals = [row[key] for row in rows if key in row]
        if all(isinstance(v, (int, float)) for v in vals):
            cells.append(f"{key} {statistics.median(vals):g} [{min(vals):g}-{max(vals):g}]"
                         if key.endswith(("_s", "_ms")) else f"{key} {sum(vals):g}")
    print(f"{name} ({len(rows)} runs): " + ", ".join(cells))
PY
[ "$passed" = "$n" ]
