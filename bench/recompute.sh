#!/usr/bin/env bash
# Activation recomputation as a plan dimension (docs/osdp.md): MODEL (gpt-25m) on RANKS (2) with global batch
# BATCH (16, so 8 rows per rank) under LIMIT (600MiB), a budget in which no plan without recomputation fits
# at the whole per-rank batch (micro-batch 8: zero3 alone needs ~870 MiB) but one fits at micro-batch 4
# (accumulation). One profile at micro-batches 4 and 8; then one `slimshard bench` invocation:
#   osdp              the planner's choice (recomputation per block allowed)
#   osdp-norecompute  the best plan without it (micro-batch 4, two micro-batches per step)
#   mb8-recompute     the best plan at micro-batch 8, which has to recompute (planned from the profile's
#                     micro-batch 8 alone)
# and the uniform zero3 at micro-batch 4 for reference. Writes OUT/recompute.txt and OUT/recompute.json.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/recompute}
model=${MODEL:-gpt-25m} ranks=${RANKS:-2} batch=${BATCH:-16} limit=${LIMIT:-600MiB} steps=${STEPS:-8}
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi="mpirun --oversubscribe --allow-run-as-root"
profile=${PROFILE:-$out/profile.json}
[ -f "$profile" ] || $mpi -n "$ranks" "$bin" profile --model "$model" --micro-batch 4,8 --out "$profile" >"$out/profile.log"
# The profile's micro-batch 8 alone: the planner's best plan there.
python3 - "$profile" "$out/profile-mb8.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
def keep8(x):
    if isinstance(x, dict):
        return {k: keep8(v) for k, v in x.items() if not (k.isdigit() and k != "8")}
    if isinstance(x, list):
        return [keep8(v) for v in x]
    return x
p = keep8(p)
p["micro_batches"] = [8]
json.dump(p, open(sys.argv[2], "w"))
PY
"$bin" plan --model "$model" --world "$ranks" --batch-size "$batch" --mem-limit "$limit" \
  --profile "$out/profile-mb8.json" --quiet --out "$out/mb8-recompute.json" >"$out/plan-mb8.txt"
printf '{"micro_batch": 4, "ops": {"*": {"strategy": "zero3"}}}\n' >"$out/zero3-mb4.json"
echo "machine: $(nproc --all) cores; $(date -u +%F); $model, $ranks ranks, batch $batch, limit $limit" |
  tee "$out/recompute.txt"
"$bin" bench -n "$ranks" --mpirun "$mpi" --model "$model" --data kjv --batch-size "$batch" --steps "$steps" \
  --mem-limit "$limit" --profile "$profile" --json "$out/recompute.json" \
  --strategies "osdp,osdp-norecompute,$out/mb8-recompute.json,$out/zero3-mb4.json" | tee -a "$out/recompute.txt"
