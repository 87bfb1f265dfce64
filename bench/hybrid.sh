#!/usr/bin/env bash
# Hybrid sharding across hosts (docs/cluster.md): gpt-25m on HOSTS x RANKS (2 x 2) hosts of this machine
# (scripts/cluster.sh), each host's link shaped to LINK (100mbit: about the OSDP paper's ratio of compute to
# bandwidth for 4 ranks on 2 cores), global batch BATCH (16), a budget LIMIT (450MiB) under which ddp does not
# fit. One `slimshard bench` invocation: ddp, zero3, zero1 / zero2 / hsdp / hsdp2 at micro-batch 2 (the largest
# at which they fit; plan files), osdp without hybrid sharding and osdp with it, each planned from one profile
# taken on the cluster; predicted step time and peak beside the measured ones, bytes between hosts per step.
# PROFILE=file plans from a profile taken before on the same cluster and link (taking one: ~27 min at 100mbit,
# every uniform strategy timed at every micro-batch).
# Needs root. Writes OUT/hybrid.txt, OUT/hybrid.json (with each osdp run's plan) and, when it profiles,
# OUT/profile.json (PROFILE=OUT/profile.json plans from it again).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/hybrid}
link=${LINK:-100mbit} hosts=${HOSTS:-2} ranks=${RANKS:-2} batch=${BATCH:-16} limit=${LIMIT:-450MiB}
steps=${STEPS:-6} model=${MODEL:-gpt-25m}
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
# shellcheck source=bench/cluster_up.sh
. "$here/bench/cluster_up.sh"
mkdir -p "$out"
cluster_up ss8 "$hosts" "$ranks" "$link"
entries="ddp,zero3"
for s in zero1 zero2 hsdp hsdp2; do
  printf '{"micro_batch": 2, "ops": {"*": {"strategy": "%s"}}}\n' "$s" >"$out/$s-mb2.json"
  entries="$entries,$out/$s-mb2.json"
done
entries="$entries,osdp-nohybrid,osdp"
keep=(--save-profile "$out/profile.json")  # the profile bench takes, unless one is given
[ -z "${PROFILE:-}" ] || keep=()
echo "machine: $(nproc --all) cores; $(date -u +%F); $hosts hosts x $ranks ranks, link $link, $model, batch $batch, limit $limit" |
  tee "$out/hybrid.txt"
# shellcheck disable=SC2086
"$bin" bench -n $((hosts * ranks)) --mpirun "mpirun $flags --allow-run-as-root --oversubscribe" --strategies "$entries" \
  --model "$model" --data kjv --batch-size "$batch" --steps "$steps" --mem-limit "$limit" --json "$out/hybrid.json" \
  ${PROFILE:+--profile "$PROFILE"} "${keep[@]}" ${BENCH_ARGS:-} | tee -a "$out/hybrid.txt"
