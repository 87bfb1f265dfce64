# shellcheck shell=bash disable=SC2154,SC2034
# cluster_up.sh — sourced by the benches that run several jobs on one cluster of this machine's hosts
# (scripts/cluster.sh): `cluster_up NAME HOSTS RANKS LINK` brings it up, takes it down when the bench exits
# (also on failure), and sets `flags` to the mpirun flags that start ranks inside its hosts. Needs `here`.
cluster_up() {
  "$here/scripts/cluster.sh" check
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  cluster_name=$1
  trap '"$here/scripts/cluster.sh" down --name "$cluster_name" >/dev/null' EXIT
  "$here/scripts/cluster.sh" up --name "$1" --hosts "$2" --ranks-per-host "$3" --link "$4" >/dev/null
  flags=$(cat "${SLIMSHARD_CLUSTER_DIR:-/tmp}/slimshard-cluster-$1/mpirun-flags")
}
