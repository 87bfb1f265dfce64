#!/usr/bin/env bash
# fp32 against bf16 (--precision bf16), side by side in one invocation, 2 ranks: tokens/s of ddp and zero3 on
# gpt-small and gpt-25m, each rank's model FLOP/s as a fraction of the bf16 GEMM ceiling measured in the same
# run, and PyTorch's DDP under torch.autocast(bf16) (../shared/bench/run_torch_ddp_peer.sh --bf16) on the same
# shapes. Then the demo's training (gpt-small, 2 ranks, batch 16, lr 3e-3) in both precisions: validation loss
# and wall time at DEMO_STEPS and LOSS_STEPS steps. Every throughput configuration runs REPEATS times
# round-robin (default 3); figures are medians. Results: a table on stdout and OUT/precision.md.
#   bench/precision.sh                       # everything, ~45 min on 2 cores
#   SHAPES=gpt-small REPEATS=1 LOSS_STEPS=0 bench/precision.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
peer=${PEER:-$here/../shared/bench/run_torch_ddp_peer.sh}
out=${OUT:-$here/bench-out/precision}
shapes=${SHAPES:-"gpt-small gpt-25m"}
repeats=${REPEATS:-3}
steps=${STEPS:-12}
batch=${BATCH:-8}
demo_steps=${DEMO_STEPS:-500}
loss_steps=${LOSS_STEPS:-1000}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
[ -x "$peer" ] || { echo "peer script not found: $peer" >&2; exit 2; }
mkdir -p "$out"

shape_args() {  # layers heads embd seq
  case $1 in
    gpt-small) echo "4 4 256 128" ;;
    gpt-25m) echo "8 8 512 256" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}
tokens_per_s() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["tokens_per_s"])' "$1"; }

echo "machine: $(nproc --all) cores; $(date -u +%F); global batch $batch; $steps steps (median after warm-up); $repeats repeats" >&2
# The bf16 GEMM ceiling of one core (the LibTorch library slimshard links; 1024^3, median of 15).
/usr/bin/python3 "$here/bench/op_precision.py" --repeats 15 --json "$out/ops.json" >"$out/ops.txt"
cat "$out/ops.txt" >&2

for ((i = 0; i < repeats; i++)); do
  for shape in $shapes; do
    read -r L H C T <<<"$(shape_args "$shape")"
    for s in ddp zero3; do
      for p in fp32 bf16; do
        mpirun --oversubscribe -n 2 "$bin" train --model "$shape" --data kjv --steps "$steps" --batch-size "$batch" \
          --eval-rows 8 --strategy "$s" --precision "$p" --metrics "$out/m.jsonl" >/dev/null 2>"$out/err" \
          || { cat "$out/err" >&2; exit 1; }
        tokens_per_s "$out/m.jsonl" >>"$out/$shape-$s-$p"
        echo "  $shape $s $p repeat $((i + 1)): $(tail -n 1 "$out/$shape-$s-$p") tokens/s" >&2
      done
    done
    "$peer" 2 --layers "$L" --heads "$H" --embd "$C" --seq-len "$T" --batch-size "$batch" --steps "$steps" --bf16 \
      | tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' >>"$out/$shape-torch-bf16"
    echo "  $shape torch autocast bf16 repeat $((i + 1)): $(tail -n 1 "$out/$shape-torch-bf16") tokens/s" >&2
  done
done

# The demo's training in both precisions: validation loss and wall time.
for n in $demo_steps $loss_steps; do
  [ "$n" -gt 0 ] || continue
  for p in fp32 bf16; do
    f="$out/demo-$n-$p.jsonl"
    if [ ! -s "$f" ] || [ -n "${FRESH:-}" ]; then
      mpirun --oversubscribe -n 2 "$bin" train --model gpt-small --data kjv --steps "$n" --batch-size 16 --lr 3e-3 \
        --eval-every "$n" --precision "$p" --metrics "$f" >/dev/null 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
    fi
    echo "  demo $n steps $p: $(tail -n 1 "$f" | python3 -c 'import json,sys; s=json.load(sys.stdin); print("val loss %.4f, %.0f s" % (s["val_loss"], s["wall_s"]))')" >&2
  done
done

python3 - "$out" "$shapes" "$demo_steps" "$loss_steps" <<'PY' | tee "$out/precision.md"
import json, statistics, sys
out, shapes, demo, loss_steps = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4])
ops = json.load(open(f"{out}/ops.json"))
ceiling = [r["gflops"] for r in ops["rows"] if r["op"].startswith("gemm") and "bfloat16" in r["dtype"]][0]
dims = {"gpt-small": (4, 4, 256, 128), "gpt-25m": (8, 8, 512, 256)}
med = lambda path: statistics.median(float(x) for x in open(path))
print(f"bf16 GEMM ceiling (one core, 1024^3): {ceiling:.0f} GFLOP/s\n")
print("| shape | strategy | fp32 tokens/s | bf16 tokens/s | bf16/fp32 | bf16 GFLOP/s per rank | of ceiling | torch autocast tokens/s | bf16/torch |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for shape in shapes:
    L, H, C, T = dims[shape]
    V = 256
    # Model FLOPs per token: 6 x the GEMM weights (blocks and LM head) + attention's 12·L·C·T (PaLM's count).
    flops = 6 * (12 * L * C * C + C * V) + 12 * L * C * T
    torch = med(f"{out}/{shape}-torch-bf16")
    for s in ("ddp", "zero3"):
        f32, b16 = med(f"{out}/{shape}-{s}-fp32"), med(f"{out}/{shape}-{s}-bf16")
        per_rank = b16 / 2 * flops / 1e9
        print(f"| {shape} | {s} | {f32:.0f} | {b16:.0f} | {b16 / f32:.2f}x | {per_rank:.0f} | "
              f"{100 * per_rank / ceiling:.0f} % | {torch:.0f} | {b16 / torch:.2f}x |")
print()
for n in (demo, loss_steps):
    if n <= 0: continue
    s = {p: json.loads(open(f"{out}/demo-{n}-{p}.jsonl").readlines()[-1]) for p in ("fp32", "bf16")}
    gap = 100 * (s["bf16"]["val_loss"] / s["fp32"]["val_loss"] - 1)
    print(f"gpt-small, 2 ranks, {n} steps (the demo's settings): val loss fp32 {s['fp32']['val_loss']:.4f} "
          f"in {s['fp32']['wall_s']:.0f} s, bf16 {s['bf16']['val_loss']:.4f} in {s['bf16']['wall_s']:.0f} s "
          f"({gap:+.2f} %, {s['fp32']['wall_s'] / s['bf16']['wall_s']:.2f}x faster)")
PY
