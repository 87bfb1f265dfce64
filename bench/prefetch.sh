#!/usr/bin/env bash
# zero3 with prefetch 0, 1 and 2, interleaved REPEATS times (default 5) in one invocation; medians and ratios.
#   bench/prefetch.sh            MODEL=gpt-small RANKS=2 REPEATS=5 bench/prefetch.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
model=${MODEL:-gpt-25m}; ranks=${RANKS:-2}; repeats=${REPEATS:-5}; batch=${BATCH:-8}; steps=${STEPS:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp -d)
for ((i = 0; i < repeats; i++)); do
  for k in 0 1 2; do
    mpirun --oversubscribe -n "$ranks" "$bin" train --model "$model" --data kjv --batch-size "$batch" --steps "$steps" \
      --eval-rows 4 --strategy zero3 --prefetch "$k" --metrics "$out/m.jsonl" >/dev/null 2>&1
    tail -n 1 "$out/m.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' >>"$out/k$k"
  done
done
python3 - "$out" <<'PY'
import sys, statistics
d = sys.argv[1]
med = {k: statistics.median(float(x) for x in open(f"{d}/k{k}")) for k in (0, 1, 2)}
for k in (0, 1, 2):
    print(f"prefetch {k}: median {med[k]:.0f} tokens/s  ({med[k] / med[0]:.2f}x prefetch 0)")
PY
rm -rf "$out"
