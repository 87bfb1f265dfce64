#!/usr/bin/env bash
# Collectives alone across hosts (docs/cluster.md): the hierarchical backend against flat MPI on HOSTS x RANKS
# (2 x 2) hosts of this machine (scripts/cluster.sh), each host's link shaped to LINK (100mbit). Each backend's
# all-reduce, all-gather and reduce-scatter are timed by `slimshard profile` (16 KiB to 16 MiB, median of 5,
# a barrier before each) on a small model (its op timing takes seconds); then flat MPI once more with OpenMPI's
# all-reduce forced to the ring (coll_tuned algorithm 4). Prints the algorithmic bandwidth (bytes / time) per
# size and hier / mpi. Needs root; about 8 minutes at 100mbit. Writes OUT/*.json and OUT/collectives.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${BIN:-$here/build/slimshard}
out=${OUT:-$here/bench-out/collectives}
link=${LINK:-100mbit} hosts=${HOSTS:-2} ranks=${RANKS:-2}
[ -x "$bin" ] || { echo "build first: make build" >&2; exit 2; }
"$here/scripts/cluster.sh" check
mkdir -p "$out"
tag="$link-${hosts}x$ranks"
run() {  # backend, output file, extra environment
  env "${@:3}" "$here/scripts/cluster.sh" run --hosts "$hosts" --ranks-per-host "$ranks" --link "$link" -- \
    "$bin" profile --model mlp --micro-batch 32 --comm-backend "$1" --out "$2" >/dev/null
}
run mpi "$out/$tag-mpi.json"
run hier "$out/$tag-hier.json"
run mpi "$out/$tag-mpi-ring.json" OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=4
python3 - "$out" "$tag" <<'EOF' | tee "$out/collectives.txt"
import json, sys
out, tag = sys.argv[1], sys.argv[2]
load = lambda k: json.load(open(f"{out}/{tag}-{k}.json"))["collectives"]
mpi, hier, ring = load("mpi"), load("hier"), load("mpi-ring")
print(f"{tag}: algorithmic bandwidth MB/s (bytes / median time), hier / mpi")
for c in ("all_reduce", "all_gather", "reduce_scatter"):
    print(f"{c:<15} {'bytes':>9} {'mpi':>8} {'hier':>8} {'hier/mpi':>9}" + ("  mpi ring" if c == "all_reduce" else ""))
    for i, (b, tm) in enumerate(mpi[c]["points"]):
        th = hier[c]["points"][i][1]
        row = f"{'':<15} {int(b):>9} {b / tm / 1e3:>8.2f} {b / th / 1e3:>8.2f} {tm / th:>8.2f}x"
        if c == "all_reduce":
            row += f"  {b / ring[c]['points'][i][1] / 1e3:>8.2f}"
        print(row)
EOF
