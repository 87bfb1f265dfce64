#!/usr/bin/env bash
# The gathers after the step left running into the next forward (the default) against the step waiting for
# them (--no-defer-gathers), docs/cluster.md: each PLANS file trained both ways, in turn, ROUNDS times, on
# HOSTS x RANKS hosts of this machine (scripts/cluster.sh) with links shaped to LINK; gpt-25m, global batch
# BATCH, STEPS steps. Prints per run tokens/s, the median step and its phases (forward, backward, after the
# optimizer), the peak; then per plan the medians and deferred / waiting. Needs root.
# PLANS: plan files (default: bench-out/defer/*.json, e.g. the hybrid bench's plans and osdp's); MODES: either
# or both of deferred, waiting.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/defer}
link=${LINK:-100mbit} hosts=${HOSTS:-2} ranks=${RANKS:-2} batch=${BATCH:-16} steps=${STEPS:-6}
rounds=${ROUNDS:-2} model=${MODEL:-gpt-25m} modes=${MODES:-deferred waiting}
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
if [ -n "${PLANS:-}" ]; then read -r -a plans <<<"$PLANS"; else plans=("$out"/*.json); fi
[ -e "${plans[0]}" ] || plans=()
[ ${#plans[@]} -gt 0 ] || { echo "no plan files (PLANS, or $out/*.json)" >&2; exit 2; }
# shellcheck source=bench/cluster_up.sh
. "$here/bench/cluster_up.sh"
mkdir -p "$out/runs"
cluster_up ss7 "$hosts" "$ranks" "$link"
echo "machine: $(nproc --all) cores; $(date -u +%F); $hosts hosts x $ranks ranks, link $link, $model, batch $batch" |
  tee "$out/defer.txt"
for round in $(seq "$rounds"); do
  for plan in "${plans[@]}"; do
    for mode in $modes; do
      extra=""
      [ "$mode" = waiting ] && extra="--no-defer-gathers"
      m="$out/runs/$(basename "$plan" .json)-$mode-$round.jsonl"
      # shellcheck disable=SC2086
      mpirun $flags --allow-run-as-root --oversubscribe -n $((hosts * ranks)) "$bin" train --model "$model" \
        --data kjv --batch-size "$batch" --steps "$steps" --eval-rows 4 --plan "$plan" $extra --metrics "$m" \
        >"${m%.jsonl}.log" 2>&1 || { echo "failed: $plan $mode (${m%.jsonl}.log)" | tee -a "$out/defer.txt"; continue; }
      python3 - "$m" "$(basename "$plan" .json)" "$mode" <<'EOF' | tee -a "$out/defer.txt"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
p = s["phase_ms"]
print(f"{sys.argv[2]:>12} {sys.argv[3]:>8}: {s['tokens_per_s']:7.1f} tokens/s, step {s['step_ms']:8.1f} ms "
      f"(forward {p['forward']:.0f}, backward {p['backward']:.0f}, comm wait {p['comm_wait']:.0f}, "
      f"after the optimizer {p['after_step']:.0f}), peak {s['peak_bytes'] / 2**20:.1f} MiB")
EOF
    done
  done
done
python3 - "$out/defer.txt" <<'EOF' | tee -a "$out/defer.txt"
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s*(\S+)\s+(deferred|waiting): +([\d.]+) tokens/s", line)
    if m: runs.setdefault(m[1], {}).setdefault(m[2], []).append(float(m[3]))
for plan, by in runs.items():
    if "deferred" in by and "waiting" in by:
        d, w = statistics.median(by["deferred"]), statistics.median(by["waiting"])
        print(f"{plan}: deferred {d:.1f}, waiting {w:.1f} tokens/s (medians): {d / w:.3f}x")
EOF
