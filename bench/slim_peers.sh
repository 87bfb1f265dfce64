#!/usr/bin/env bash
# Slim-DP against what a user would pick instead, on slimshard's task: gpt-small on the KJV bytes, the same
# batches (bench/torch_kjv_peer.py reproduces slimshard's sampler), global batch 16, AdamW lr 3e-3, STEPS steps
# (1000), RANKS ranks (4) on this machine, validated at the end. slimshard: DDP, Slim-DP's recommended setting
# with the overlapped round (--slim-apply next) and with the original order (now). PyTorch 1.13 over gloo: DDP,
# DDP with fp16_compress_hook, post-local SGD (model averaging every PERIOD steps after 100 DDP steps). The
# loss does not depend on the link, the bytes per step do not depend on its speed: the table and the chart
# (validation loss against MiB sent per rank) come from one host. Finished runs are kept (FRESH=1 reruns).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/slim-peers}
steps=${STEPS:-1000}
ranks=${RANKS:-4}
period=${PERIOD:-4}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
common="--model gpt-small --data kjv --steps $steps --batch-size 16 --lr 3e-3 --eval-every $steps"
rec="--strategy slim --slim-core 0.5 --slim-explore 0.2 --slim-wire bf16 --slim-adam corrected"
run_ours() {  # tag args...
  local tag=$1; shift
  [ -s "$out/$tag.jsonl" ] && [ -z "${FRESH:-}" ] && return
  # shellcheck disable=SC2086
  mpirun --oversubscribe -n "$ranks" "$bin" train $common "$@" --metrics "$out/$tag.tmp" >"$out/$tag.log" 2>&1
  mv "$out/$tag.tmp" "$out/$tag.jsonl"
}
run_torch() {  # mode
  local tag=torch-$1
  [ -s "$out/$tag.jsonl" ] && [ -z "${FRESH:-}" ] && return
  export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 20000)) WORLD_SIZE=$ranks
  local pids=()
  for ((r = 0; r < ranks; r++)); do
    RANK=$r /usr/bin/python3 "$here/bench/torch_kjv_peer.py" --mode "$1" --steps "$steps" --period "$period" \
      --metrics "$out/$tag.tmp" >>"$out/$tag.log" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  mv "$out/$tag.tmp" "$out/$tag.jsonl"
}
run_ours ddp --strategy ddp
run_ours slim-next $rec --slim-apply next
run_ours slim-now $rec --slim-apply now
run_torch ddp
run_torch fp16
run_torch localsgd
python3 - "$out" <<'PY' | tee "$out/slim-peers.md"
import json, sys
out = sys.argv[1]
rows = [("slimshard DDP", "ddp"), ("slimshard Slim-DP α0.5 β0.2 bf16 corrected, apply next", "slim-next"),
        ("slimshard Slim-DP, same, apply now", "slim-now"), ("PyTorch DDP", "torch-ddp"),
        ("PyTorch DDP + fp16_compress_hook", "torch-fp16"), ("PyTorch post-local SGD", "torch-localsgd")]
summ = {t: json.loads(open(f"{out}/{t}.jsonl").read().splitlines()[-1]) for _, t in rows}
base = summ["ddp"]
print("| run | val loss | vs slimshard DDP | MiB sent per rank | vs DDP's bytes |")
print("|---|---:|---:|---:|---:|")
for name, t in rows:
    s = summ[t]
    print(f"| {name} | {s['val_loss']:.4f} | {100 * (s['val_loss'] / base['val_loss'] - 1):+.2f} % | "
          f"{s['comm_bytes'] / 2**20:.0f} | {s['comm_bytes'] / base['comm_bytes']:.2f} |")
PY
# The chart: validation loss against bytes (one point per run, the end of training).
"$bin" plot --x bytes --y val_loss $(for t in ddp slim-next slim-now torch-ddp torch-fp16 torch-localsgd; do
  echo "$out/$t.jsonl:$t"; done) --out "$out/loss-vs-bytes.svg" >/dev/null 2>&1 || true
