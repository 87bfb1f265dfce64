#!/usr/bin/env bash
# slimshard DDP against PyTorch's DDP (Debian python3-torch, gloo) on the same GPT shapes, back to back in one
# invocation: gpt-small and gpt-25m, global batch 8, 1 and 2 ranks. Prints tokens/s of both, the ratio, and the
# scaling from 1 to 2 ranks. Each configuration runs REPEATS times (default 3), alternating the two systems;
# the figures are medians.
#   bench/ddp_vs_torch.sh                 # everything
#   SHAPES=gpt-small RANKS="2" REPEATS=5 bench/ddp_vs_torch.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
peer=${PEER:-$here/../shared/bench/run_torch_ddp_peer.sh}
shapes=${SHAPES:-"gpt-small gpt-25m"}
ranks=${RANKS:-"1 2"}
repeats=${REPEATS:-3}
batch=${BATCH:-8}
steps=${STEPS:-12}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
[ -x "$peer" ] || { echo "peer script not found: $peer" >&2; exit 2; }
out=$(mktemp -d)

shape_args() {  # layers heads embd seq
  case $1 in
    gpt-small) echo "4 4 256 128" ;;
    gpt-25m) echo "8 8 512 256" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}

median() { python3 -c 'import sys; v=sorted(float(x) for x in sys.argv[1:]); print(v[len(v)//2])' "$@"; }

echo "machine: $(nproc --all) cores; $(date -u +%F); global batch $batch; $steps steps (median after warm-up); $repeats repeats" >&2
for shape in $shapes; do
  read -r L H C T <<<"$(shape_args "$shape")"
  for n in $ranks; do
    for ((i = 0; i < repeats; i++)); do
      "$peer" "$n" --layers "$L" --heads "$H" --embd "$C" --seq-len "$T" --batch-size "$batch" --steps "$steps" \
        | tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' >>"$out/torch-$shape-$n"
      mpirun --oversubscribe -n "$n" "$bin" train --model "$shape" --data kjv --steps "$steps" --batch-size "$batch" \
        --eval-rows 8 --metrics "$out/m.jsonl" >/dev/null 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
      tail -n 1 "$out/m.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])' \
        >>"$out/slim-$shape-$n"
      echo "  $shape n=$n repeat $((i + 1)): torch $(tail -n 1 "$out/torch-$shape-$n") slimshard $(tail -n 1 "$out/slim-$shape-$n") tokens/s" >&2
    done
  done
done

printf '\n%-10s %5s %14s %16s %7s\n' shape ranks "torch tok/s" "slimshard tok/s" ratio
for shape in $shapes; do
  for n in $ranks; do
    t=$(median $(cat "$out/torch-$shape-$n")); s=$(median $(cat "$out/slim-$shape-$n"))
    printf '%-10s %5s %14.0f %16.0f %6.2fx\n' "$shape" "$n" "$t" "$s" "$(python3 -c "print($s/$t)")"
  done
done
if [[ " $ranks " == *" 1 "* && " $ranks " == *" 2 "* ]]; then
  echo
  for shape in $shapes; do
    t1=$(median $(cat "$out/torch-$shape-1")); t2=$(median $(cat "$out/torch-$shape-2"))
    s1=$(median $(cat "$out/slim-$shape-1")); s2=$(median $(cat "$out/slim-$shape-2"))
    printf 'scaling 1 -> 2 ranks, %-9s torch %.2fx   slimshard %.2fx\n' "$shape" "$(python3 -c "print($t2/$t1)")" \
      "$(python3 -c "print($s2/$s1)")"
  done
fi
rm -rf "$out"
