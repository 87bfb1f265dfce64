#!/usr/bin/env bash
# torch_peer_on_cluster.sh NAME RANKS_PER_HOST [peer args...] — PyTorch's DDP peer (../shared/bench/
# torch_ddp_peer.py, gloo over TCP) with its processes inside the hosts of a cluster that `scripts/cluster.sh up
# --name NAME` made: rank r on host r / RANKS_PER_HOST, rendezvous at host 0's address. Prints the peer's JSON.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
name=$1 per_host=$2
shift 2
peer=${PEER_PY:-$here/../shared/bench/torch_ddp_peer.py}
state=${SLIMSHARD_CLUSTER_DIR:-/tmp}/slimshard-cluster-$name
[ -f "$state/hosts" ] || { echo "cluster $name is not up (scripts/cluster.sh up --name $name)" >&2; exit 2; }
mapfile -t addrs < <(awk '{print $1}' "$state/hosts")
world=$(( ${#addrs[@]} * per_host ))
port=$((20000 + RANDOM % 20000))
pids=()
for ((r = 0; r < world; r++)); do
  h=$((r / per_host))
  "$here/scripts/cluster.sh" exec --name "$name" --host "$h" -- env MASTER_ADDR="${addrs[0]}" MASTER_PORT="$port" \
    WORLD_SIZE="$world" RANK="$r" LOCAL_RANK=$((r % per_host)) OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 \
    /usr/bin/python3 "$peer" "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
