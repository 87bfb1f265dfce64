#!/usr/bin/env bash
# The memory estimate and OSDP's choice on shapes nobody tuned for: 12 GPT shapes (depth 2–12, width 128–1024,
# heads, T 32–512, global batch 2–32, 2 and 4 ranks), the MLP and the CNN. Per shape, one profile, then two
# `slimshard bench` invocations: (1) ddp, zero1, zero2, zero3 without a budget — each one's measured peak per
# rank against `slimshard memory`'s estimate; (2) the same four and osdp under a budget halfway between zero3's
# and ddp's measured peaks — osdp's tokens/s against every uniform strategy that fits (as measured: the others
# stop with an out-of-budget error). Prints a table and writes it, with every bench's JSON, to OUT.
# Goals (docs/osdp.md): every estimate within 10 % of measured and never more than 2 % below; osdp ≥ 0.97× the
# best uniform strategy that fits on every shape, ≥ 1.1× zero3 on the median shape. The runs under the budget
# are repeated REPEAT times round-robin (default 3; medians). About an hour on 2 cores.
#   bench/osdp_grid.sh                 SHAPES="w2-wide" STEPS=6 bench/osdp_grid.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/osdp-grid}
steps=${STEPS:-10}
repeat=${REPEAT:-3}  # the runs under the budget, each entry this many times round-robin (medians)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
mkdir -p "$out"

# name | ranks | model flags | global batch
all_shapes="
w2-wide|2|--model gpt --n-layer 2 --n-head 8 --n-embd 1024 --seq-len 64|4
w2-deep|2|--model gpt --n-layer 12 --n-head 4 --n-embd 128 --seq-len 256|16
w2-small|2|--model gpt-small|16
w2-long|2|--model gpt --n-layer 6 --n-head 6 --n-embd 384 --seq-len 512|8
w2-short|2|--model gpt --n-layer 8 --n-head 8 --n-embd 512 --seq-len 32|32
w2-tiny-batch|2|--model gpt --n-layer 2 --n-head 12 --n-embd 768 --seq-len 128|2
w2-mid|2|--model gpt --n-layer 8 --n-head 12 --n-embd 768 --seq-len 64|16
w4-512|4|--model gpt --n-layer 4 --n-head 8 --n-embd 512 --seq-len 256|8
w4-deep|4|--model gpt --n-layer 12 --n-head 8 --n-embd 256 --seq-len 64|32
w4-wide|4|--model gpt --n-layer 3 --n-head 16 --n-embd 1024 --seq-len 32|8
w4-narrow-long|4|--model gpt --n-layer 6 --n-head 2 --n-embd 128 --seq-len 512|4
w4-640|4|--model gpt --n-layer 10 --n-head 10 --n-embd 640 --seq-len 128|8
w2-mlp|2|--model mlp|64
w2-cnn|2|--model cnn|64"
shapes=${SHAPES:-$(echo "$all_shapes" | cut -d'|' -f1 | xargs)}

echo "machine: $(nproc --all) cores; $(date -u +%F); $steps steps per run, budget runs x$repeat" >&2
for name in $shapes; do
  line=$(echo "$all_shapes" | grep "^$name|") || { echo "unknown shape $name" >&2; exit 2; }
  IFS='|' read -r _ ranks model batch <<<"$line"
  data=kjv; case "$model" in *mlp*|*cnn*) data=fashion-mnist ;; esac
  local_batch=$((batch / ranks)); micro=""
  for b in $local_batch $((local_batch / 2)) $((local_batch / 4)) $((local_batch / 8)); do
    [ "$b" -ge 1 ] && [ $((local_batch % b)) -eq 0 ] && micro="$b${micro:+,}$micro"
  done
  echo "== $name: $ranks ranks, $model, global batch $batch (profile at micro-batches $micro)" >&2
  # shellcheck disable=SC2086
  mpirun --oversubscribe -n "$ranks" "$bin" profile $model --micro-batch "$micro" --out "$out/$name-profile.json" \
    >"$out/$name-profile.txt"
  common="$model --data $data --batch-size $batch --steps $steps --profile $out/$name-profile.json"
  # shellcheck disable=SC2086
  "$bin" bench -n "$ranks" --strategies ddp,zero1,zero2,zero3 $common --json "$out/$name-free.json" \
    >"$out/$name-free.txt" 2>/dev/null
  limit=$(python3 -c "
import json; r = {x['strategy']: x for x in json.load(open('$out/$name-free.json'))['results']}
print(int((r['zero3']['peak_bytes'] + r['ddp']['peak_bytes']) / 2))")
  # shellcheck disable=SC2086
  "$bin" bench -n "$ranks" --strategies ddp,zero1,zero2,zero3,osdp $common --mem-limit "$limit" \
    --repeat "$repeat" --json "$out/$name-budget.json" >"$out/$name-budget.txt" 2>/dev/null
done

python3 - "$out" $shapes <<'PY' | tee "$out/grid.md"
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
mib = lambda b: b / 2**20
print("| shape | ranks | batch | est/measured ddp · zero1 · zero2 · zero3 | budget MiB | fits | tokens/s osdp | best uniform that fits | osdp/best | osdp/zero3 |")
print("|---|---:|---:|---|---:|---|---:|---|---:|---:|")
worst_over, worst_under, vs_best, vs_z3 = 0.0, 0.0, [], []
for n in names:
    free = json.load(open(f"{out}/{n}-free.json")); bud = json.load(open(f"{out}/{n}-budget.json"))
    rows = {r["strategy"]: r for r in free["results"]}
    ratios = []
    for s in ("ddp", "zero1", "zero2", "zero3"):
        r = rows[s]
        q = r["estimated_peak_bytes"] / r["peak_bytes"] if "peak_bytes" in r else float("nan")
        ratios.append(q); worst_over = max(worst_over, q - 1); worst_under = max(worst_under, 1 - q)
    b = {r["strategy"]: r for r in bud["results"]}
    fit = [s for s in ("ddp", "zero1", "zero2", "zero3") if "tokens_per_s" in b[s]]
    best = max(fit, key=lambda s: b[s]["tokens_per_s"]) if fit else None
    o = b["osdp"].get("tokens_per_s")
    rb = o / b[best]["tokens_per_s"] if (o and best) else float("nan")
    rz = o / b["zero3"]["tokens_per_s"] if (o and "tokens_per_s" in b["zero3"]) else float("nan")
    if rb == rb: vs_best.append(rb)
    if rz == rz: vs_z3.append(rz)
    print(f"| {n} | {free['world']} | {free['batch_size']} | " + " · ".join(f"{q:.3f}" for q in ratios) +
          f" | {mib(bud['mem_limit']):.0f} | {','.join(fit) or '-'} | {o or 0:.0f} | "
          f"{best or '-'} {b[best]['tokens_per_s'] if best else 0:.0f} | {rb:.3f} | {rz:.3f} |")
print()
print(f"estimates: at most {100 * worst_over:.1f} % above measured, at most {100 * worst_under:.1f} % below")
if vs_best: print(f"osdp / best uniform that fits: min {min(vs_best):.3f}, median {statistics.median(vs_best):.3f}")
if vs_z3: print(f"osdp / zero3: median {statistics.median(vs_z3):.3f}, min {min(vs_z3):.3f}, max {max(vs_z3):.3f}")
PY
