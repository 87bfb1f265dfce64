#!/usr/bin/env bash
# Slim-DP against DDP, back to back in one invocation, equal steps and seeds: KJV gpt-small at 2 and 4 ranks and the
# Fashion-MNIST CNN at 4 ranks; DDP, then Slim-DP at its defaults (α 0.25, β 0.1), two other α/β settings, and
# the defaults with --slim-adam corrected, the defaults with a full synchronisation every 10 rounds, and α 0.5,
# β 0.2 on the bf16 wire (--slim-wire bf16: half the bytes per element) with local and with corrected AdamW.
# Prints, per run: bytes communicated per rank (and the fraction of DDP's), final validation loss (CNN: test
# accuracy) and its gap to DDP, tokens/s (CNN: images/s); writes every run's metrics and the plots (loss vs step,
# loss vs bytes; one SVG per experiment) to OUT (default bench-out/slim-dp).
# gpt-small runs 1000 steps and validates only at the end: 300 steps end in the middle of the fast descent of the
# loss, where a delay of a few dozen steps reads as a large gap, and every evaluation is also a full Slim-DP
# synchronisation that would help it. Its plots show the training loss (mean of 50 steps). The CNN validates
# every 50 steps. About 2 h 20 min on 2 cores (a gpt-small run: ~7 min at 2 ranks, ~9 at 4).
#   bench/slim_dp.sh
#   STEPS=100 EXPERIMENTS="gpt-small-2" bench/slim_dp.sh
# A run whose metrics in OUT are complete and came from the same command is not run again (FRESH=1 reruns all).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/slim-dp}
steps=${STEPS:-1000}
cnn_steps=${CNN_STEPS:-400}
experiments=${EXPERIMENTS:-"gpt-small-2 gpt-small-4 cnn-4"}
settings=${SETTINGS:-"ddp slim:0.25:0.1 slim:0.1:0.05 slim:0.5:0.2 slim:0.25:0.1:corrected slim:0.25:0.1:local:10
  slim:0.5:0.2:local:0:bf16 slim:0.5:0.2:corrected:0:bf16"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
mkdir -p "$out"

echo "machine: $(nproc --all) cores; $(date -u +%F); gpt-small $steps steps, CNN $cnn_steps steps" >&2
for exp in $experiments; do
  case $exp in
    gpt-small-*) n=${exp##*-}
      args="--model gpt-small --data kjv --steps $steps --batch-size 16 --lr 3e-3 --eval-every $steps"
      y=(--y loss --mean-of 50) ;;
    cnn-*) n=${exp##*-}
      args="--model cnn --data fashion-mnist --steps $cnn_steps --batch-size 64 --lr 2e-3 --eval-every 50"
      y=(--y val_loss) ;;
    *) echo "unknown experiment $exp" >&2; exit 2 ;;
  esac
  curves=()
  for s in $settings; do
    if [ "$s" = ddp ]; then
      flags="--strategy ddp"; tag=ddp
    else
      IFS=: read -r _ a b adam fs wire <<<"$s"  # slim:α:β[:adam[:full-sync rounds[:wire]]]
      flags="--strategy slim --slim-core $a --slim-explore $b --slim-adam ${adam:-local} --slim-full-sync ${fs:-0}"
      flags+="${wire:+ --slim-wire $wire}"
      [ "${fs:-0}" = 0 ] && fs=
      tag="slim-a$a-b$b${adam:+-$adam}${fs:+-fs$fs}${wire:+-$wire}"
    fi
    m="$out/$exp-$tag.jsonl"
    cmd="mpirun --oversubscribe -n $n $bin train $args $flags --metrics $m"
    curves+=("$m:$tag")
    # A finished run of the same command (its metrics end with the summary line) is kept: an interrupted
    # bench continues; a run left from other settings (STEPS, say) is run again.
    if [ -z "${FRESH:-}" ] && [ "$(cat "$m.cmd" 2>/dev/null)" = "$cmd" ] &&
      tail -n 1 "$m" 2>/dev/null | grep -q '"summary":true'; then
      echo "  $exp $tag: kept from $m (FRESH=1 reruns)" >&2; continue
    fi
    echo "  $exp $tag ..." >&2
    $cmd >"$out/$exp-$tag.log" 2>&1 || { tail -n 5 "$out/$exp-$tag.log" >&2; exit 1; }
    echo "$cmd" >"$m.cmd"
  done
  "$bin" plot --x step "${y[@]}" --title "$exp: ${y[1]} by step" --out "$out/$exp-loss-vs-step.svg" "${curves[@]}"
  "$bin" plot --x bytes "${y[@]}" --title "$exp: ${y[1]} by MiB sent per rank" \
    --out "$out/$exp-loss-vs-bytes.svg" "${curves[@]}"
done

python3 - "$out" $experiments <<'EOF'
import json, os, sys
out, exps = sys.argv[1], sys.argv[2:]
print(f"\n{'experiment':<12} {'run':<32} {'MiB sent/rank':>13} {'vs ddp':>7} {'val loss':>9} {'gap':>7} {'acc %':>6} {'units/s':>9}")
for exp in exps:
    runs = sorted(f for f in os.listdir(out) if f.startswith(exp + "-") and f.endswith(".jsonl"))
    runs.sort(key=lambda f: (not f.endswith("-ddp.jsonl"), f))
    base = None
    for f in runs:
        s = [json.loads(l) for l in open(os.path.join(out, f)) if l.strip()][-1]
        tag = f[len(exp) + 1:-6]
        rate = s.get("tokens_per_s") or s.get("samples_per_s") or 0
        if base is None: base = s
        acc = s.get("val_acc")
        print(f"{exp:<12} {tag:<32} {s['comm_bytes'] / 2**20:13.1f} {s['comm_bytes'] / base['comm_bytes']:7.2f} "
              f"{s['val_loss']:9.4f} {100 * (s['val_loss'] / base['val_loss'] - 1):+6.1f}% "
              f"{(100 * acc if acc is not None else float('nan')):6.2f} {rate:9.0f}")
EOF
echo "metrics, logs and plots in $out" >&2
