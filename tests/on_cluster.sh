#!/usr/bin/env bash
# on_cluster.sh HOSTS RANKS_PER_HOST [--link RATE] -- COMMAND... — runs COMMAND under mpirun on a cluster of
# network namespaces (scripts/cluster.sh run). Where namespaces cannot be made (no root): with CI=true the
# test fails saying so; otherwise it is skipped (exit 77, CTest's SKIP_RETURN_CODE) saying so.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
hosts=$1 ranks=$2
shift 2
if ! why=$("$here/scripts/cluster.sh" check 2>&1); then
  echo "multi-host test needs network namespaces: $why" >&2
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
link=()
if [ "${1:-}" = --link ]; then link=(--link "$2"); shift 2; fi
[ "${1:-}" = -- ] && shift
exec "$here/scripts/cluster.sh" run --hosts "$hosts" --ranks-per-host "$ranks" "${link[@]}" -- "$@"
