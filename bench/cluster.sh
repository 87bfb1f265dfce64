#!/usr/bin/env bash
# slimshard across hosts: a cluster of network namespaces on this machine (scripts/cluster.sh), 2 hosts x 1
# rank and 2 x 2, each host's link shaped to LINKS (10gbit, 1gbit, 100mbit), gpt-small (and gpt-25m on the
# faster links). Per (link, hosts x ranks, shape), in one invocation: tokens/s, step time and bytes per step
# between hosts for ddp (hierarchical and flat `--comm-backend mpi`), zero2, zero3, Slim-DP's recommended
# setting (its round overlapped with the next step, and `--slim-apply now`; slim-fwd: `forward`), osdp under a budget halfway
# between zero3's and ddp's estimated peaks (profiled on the cluster, so it measures the links), and PyTorch's
# DDP over gloo with its processes in the same hosts. Optional configs (CONFIGS=...): ddp-b1 (ddp with 1 MiB
# buckets), ddp-bf16 (gradients reduced in bf16) and torch-fp16 (PyTorch with its fp16 compression hook). Each run is
# written under OUT and kept: rerunning the script runs only what is missing (FRESH=1 runs everything again).
# Prints the table and writes it to OUT/cluster.md. Needs root. Hours on 2 cores with everything; pick:
#   LINKS=100mbit TOPOS=2x2 SHAPES=gpt-small bench/cluster.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/cluster}
links=${LINKS:-"10gbit 1gbit 100mbit"}
topos=${TOPOS:-"2x1 2x2"}
shapes=${SHAPES:-"gpt-small gpt-25m"}
configs=${CONFIGS:-"ddp ddp-mpi zero2 zero3 slim slim-now osdp torch"}
steps=${STEPS:-8}
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
"$here/scripts/cluster.sh" check
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
name=ss9
trap '"$here/scripts/cluster.sh" down --name $name' EXIT

shape_of() {  # batch layers heads embd seq
  case $1 in
    gpt-small) echo "16 4 4 256 128" ;;
    gpt-25m) echo "8 8 8 512 256" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}

echo "machine: $(nproc --all) cores; $(date -u +%F); $steps steps per run (median after 2)" >&2
for link in $links; do
  for topo in $topos; do
    H=${topo%x*} R=${topo#*x} W=$((${topo%x*} * ${topo#*x}))
    up=""
    for shape in $shapes; do
      [ "$shape" = gpt-25m ] && [ "$link" = 100mbit ] && continue  # hours per run: zero3 moves 2 x 100 MB a step
      read -r batch L Hd C T <<<"$(shape_of "$shape")"
      common="--model $shape --data kjv --steps $steps --batch-size $batch --eval-rows 8"
      for cfg in $configs; do
        f="$out/$link-$topo-$shape-$cfg.jsonl"
        [ -s "$f" ] && [ -z "${FRESH:-}" ] && continue
        if [ -z "$up" ]; then
          "$here/scripts/cluster.sh" up --name $name --hosts "$H" --ranks-per-host "$R" --link "$link" >/dev/null
          flags=$(cat "${SLIMSHARD_CLUSTER_DIR:-/tmp}/slimshard-cluster-$name/mpirun-flags")
          up=1
        fi
        launch="mpirun --allow-run-as-root --oversubscribe $flags -n $W $bin"
        case $cfg in
          ddp) args="--strategy ddp" ;;
          ddp-mpi) args="--strategy ddp --comm-backend mpi" ;;
          ddp-b1) args="--strategy ddp --bucket-mib 1" ;;
          ddp-bf16) args="--strategy ddp --bucket-mib 1 --reduce-dtype bf16" ;;
          zero2 | zero3) args="--strategy $cfg" ;;
          slim) args="--strategy slim --slim-core 0.5 --slim-explore 0.2 --slim-wire bf16 --slim-adam corrected --slim-apply next" ;;
          slim-now) args="--strategy slim --slim-core 0.5 --slim-explore 0.2 --slim-wire bf16 --slim-adam corrected --slim-apply now" ;;
          slim-fwd) args="--strategy slim --slim-core 0.5 --slim-explore 0.2 --slim-wire bf16 --slim-adam corrected --slim-apply forward" ;;
          osdp)
            est() { "$bin" memory --model "$shape" --world "$W" --batch-size "$batch" --strategy "$1" --json "$out/est.json" \
              >/dev/null && python3 -c 'import json; print(json.load(open("'"$out"'/est.json"))["peak_bytes"])'; }
            args="--strategy osdp --mem-limit $(( ($(est ddp) + $(est zero3)) / 2 ))" ;;
          torch | torch-fp16)
            hook=(); [ "$cfg" = torch-fp16 ] && hook=(--comm-hook fp16)
            "$here/bench/torch_peer_on_cluster.sh" $name "$R" --layers "$L" --heads "$Hd" --embd "$C" --seq-len "$T" \
              --batch-size "$batch" --steps "$steps" --warmup 2 "${hook[@]}" | tail -n 1 >"$f.tmp" && mv "$f.tmp" "$f"
            echo "  $link $topo $shape $cfg: $(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$f") tokens/s" >&2
            continue ;;
        esac
        # shellcheck disable=SC2086
        $launch train $common $args --metrics "$f.tmp" >"$out/$link-$topo-$shape-$cfg.log" 2>&1 \
          || { echo "  $link $topo $shape $cfg: FAILED (see $out/$link-$topo-$shape-$cfg.log)" >&2; continue; }
        mv "$f.tmp" "$f"
        echo "  $link $topo $shape $cfg: $(tail -n 1 "$f" | python3 -c 'import json,sys; s=json.load(sys.stdin); print("%.0f tokens/s, %.1f MiB/step between hosts" % (s["tokens_per_s"], s["comm_bytes_inter_per_step"] / 2**20))')" >&2
      done
    done
    [ -n "$up" ] && "$here/scripts/cluster.sh" down --name $name
  done
done

python3 - "$out" "$links" "$topos" "$shapes" "$configs" <<'PY' | tee "$out/cluster.md"
import json, os, sys
out, links, topos, shapes, configs = sys.argv[1], *[a.split() for a in sys.argv[2:]]
def summary(path):
    if not os.path.exists(path): return None
    lines = open(path).read().splitlines()
    return json.loads(lines[-1]) if lines else None
print("| link | hosts x ranks | shape | run | tokens/s | median step ms | MiB/step between hosts | vs ddp (hier) |")
print("|---|---|---|---|---:|---:|---:|---:|")
for link in links:
    for topo in topos:
        for shape in shapes:
            base = summary(f"{out}/{link}-{topo}-{shape}-ddp.jsonl")
            for cfg in configs:
                s = summary(f"{out}/{link}-{topo}-{shape}-{cfg}.jsonl")
                if not s: continue
                tps = s["tokens_per_s"]
                step = s.get("step_ms", 1e3 * s.get("step_s_median", 0))
                inter = s.get("comm_bytes_inter_per_step")
                rel = f"{tps / base['tokens_per_s']:.2f}x" if base else "-"
                print(f"| {link} | {topo} | {shape} | {cfg} | {tps:.0f} | {step:.0f} | "
                      f"{'-' if inter is None else f'{inter / 2**20:.1f}'} | {rel} |")
PY
