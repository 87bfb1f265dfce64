#!/usr/bin/env bash
# Oracle check of the OSDP search on this machine: profile, plan under a budget, then measure the chosen plan
# and its neighbours (each op group switched to each other strategy) in one bench invocation. The chosen plan
# should be within 5 % of the best measured plan that fits.
#   bench/osdp_oracle.sh                   MODEL=gpt-small RANKS=2 BATCH=8 LIMIT=70MiB bench/osdp_oracle.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
model=${MODEL:-gpt-small}; ranks=${RANKS:-2}; batch=${BATCH:-8}; limit=${LIMIT:-70MiB}; steps=${STEPS:-12}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
local_batch=$((batch / ranks))
micro=""; for b in 1 2 4 8 16; do [ $((local_batch % b)) -eq 0 ] && [ $b -le $local_batch ] && micro="$micro${micro:+,}$b"; done
mpirun --oversubscribe -n "$ranks" "$bin" profile --model "$model" --micro-batch "$micro" --out "$out/profile.json" >&2
"$bin" plan --model "$model" --world "$ranks" --batch-size "$batch" --mem-limit "$limit" --profile "$out/profile.json" \
  --quiet --out "$out/chosen.json" >&2
plans=$(python3 - "$out" <<'PY'
import json, re, sys, os
out = sys.argv[1]
chosen = json.load(open(f"{out}/chosen.json"))
groups = {}
for name in chosen["ops"]:
    g = re.sub(r"blocks\.\d+\.", "blocks.*.", name)
    g = re.sub(r"\.ln\d$", ".ln*", g)
    if g in ("wte", "wpe"): g = "embeddings"
    groups.setdefault(g, []).append(name)
plans = []
for g, names in groups.items():
    current = {chosen["ops"][n]["strategy"] for n in names}
    for s in ("ddp", "zero1", "zero2", "zero3"):
        if current == {s}: continue
        p = json.loads(json.dumps(chosen)); p.pop("predicted", None)
        for n in names: p["ops"][n] = {"strategy": s}
        path = f"{out}/flip-{g.replace('*', 'x')}-{s}.json"
        json.dump(p, open(path, "w"), indent=1); plans.append(path)
print(",".join([f"{out}/chosen.json"] + plans))
PY)
"$bin" bench -n "$ranks" --strategies "$plans" --model "$model" --data kjv --batch-size "$batch" --steps "$steps" \
  --mem-limit "$limit" --profile "$out/profile.json" --json "$out/bench.json" >"$out/bench.txt" 2>/dev/null
cat "$out/bench.txt"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["results"] if "tokens_per_s" in r]
chosen = rows[0] if rows and rows[0]["strategy"].endswith("chosen.json") else None
best = max(rows, key=lambda r: r["tokens_per_s"])
if chosen is None:
    print("the chosen plan did not run"); sys.exit(1)
print(f"chosen plan: {chosen['tokens_per_s']:.0f} tokens/s; best measured of {len(rows)} fitting plans: "
      f"{best['tokens_per_s']:.0f} ({best['strategy'].split('/')[-1]}); chosen / best = "
      f"{chosen['tokens_per_s'] / best['tokens_per_s']:.3f}")
PY
