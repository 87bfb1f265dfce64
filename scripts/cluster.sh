#!/usr/bin/env bash
# cluster.sh — a cluster of H hosts on this machine, for running slimshard across "machines" over real TCP.
# Each host is a network namespace with its own hostname (a UTS namespace per process it starts), joined to
# a bridge in the root namespace by a veth pair whose two ends are shaped with `tc htb` to the link rate (this
# kernel has no netem: a rate, no added delay). mpirun runs in the root namespace and starts its daemons in
# the hosts through an rsh agent written here, so OpenMPI sees H hosts: TCP between them, shared memory
# within one. Addresses are only those of the namespaces and bridge made here (10.77.K.0/24).
#
#   scripts/cluster.sh up --hosts 2 [--link 1gbit|none] [--name ss0]   hosts, hostfile, agent; prints the mpirun flags
#   scripts/cluster.sh status [--name ss0]
#   scripts/cluster.sh check                                          exit 0 if hosts can be made here, else 2
#   scripts/cluster.sh exec --host I [--name ss0] -- COMMAND...       COMMAND inside host I, under its hostname
#   scripts/cluster.sh down [--name ss0]                              removes everything `up` made
#   scripts/cluster.sh run --hosts 2 --ranks-per-host 2 [--link 100mbit] -- build/slimshard train ...
#       brings a fresh cluster up, runs the command under mpirun across it, takes it down (also on failure or
#       Ctrl-C) and exits with the command's status.
# Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN): without, exits 2 saying so.
set -euo pipefail

die() { echo "cluster.sh: $*" >&2; exit 2; }
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
hosts=2 ranks=1 link=none name="" host=0 state_root=${SLIMSHARD_CLUSTER_DIR:-/tmp}
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=${2:?}; shift 2 ;;
    --ranks-per-host) ranks=${2:?}; shift 2 ;;
    --link) link=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --host) host=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $hosts =~ ^[1-9][0-9]?$ ]] && [ "$hosts" -le 64 ] || die "--hosts: a number from 1 to 64, got '$hosts'"
[[ $ranks =~ ^[1-9][0-9]?$ ]] || die "--ranks-per-host: a number from 1 to 99, got '$ranks'"
[[ $link == none || $link =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] \
  || die "--link: a rate like 100mbit or 1gbit, or none; got '$link'"
[ -z "$name" ] || [[ $name =~ ^ss[0-9]{1,2}$ ]] || die "--name: ss0 to ss99, got '$name'"

need_privileges() {
  [ "$(id -u)" -eq 0 ] || die "needs root (or CAP_NET_ADMIN) to create network namespaces; run it as root"
  command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null \
    || die "needs iproute2 (ip, tc) and util-linux (unshare)"
  local probe="ssprobe$$"
  ip netns add "$probe" 2>/dev/null || die "cannot create a network namespace here (needs CAP_NET_ADMIN)"
  ip netns del "$probe"
}

# The cluster's number K (its subnet 10.77.K.0/24) from its name ssK.
index_of() { echo "${1#ss}"; }
state_of() { echo "$state_root/slimshard-cluster-$1"; }
ns_of() { echo "$1h$2"; }                       # host i's namespace and hostname: ss0h1
addr_of() { echo "10.77.$(index_of "$1").$((10 + $2))"; }

down() {
  local n=$1 dir
  dir=$(state_of "$n")
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${n}h[0-9]+$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${n}(v[0-9]+|br)$" || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  rm -rf "$dir"
}

shape() {  # shape NS DEV RATE: htb at RATE on DEV's egress (in namespace NS, or the root one if NS is "")
  local ns=$1 dev=$2 rate=$3 run=()
  [ -n "$ns" ] && run=(ip netns exec "$ns")
  "${run[@]}" tc qdisc add dev "$dev" root handle 1: htb default 10
  "${run[@]}" tc class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" ceil "$rate" quantum 60000
}

up() {
  local n=$1 dir k br
  dir=$(state_of "$n")
  k=$(index_of "$n")
  br="${n}br"
  down "$n"
  mkdir -p "$dir"
  ip link add "$br" type bridge
  ip addr add "10.77.$k.1/24" dev "$br"
  ip link set "$br" up
  : >"$dir/hostfile"
  : >"$dir/hosts"
  for ((i = 0; i < hosts; i++)); do
    local ns veth addr
    ns=$(ns_of "$n" "$i") veth="${n}v$i" addr=$(addr_of "$n" "$i")
    ip netns add "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    if [ "$link" != none ]; then
      shape "$ns" eth0 "$link"  # the host's sending side
      shape "" "$veth" "$link"  # its receiving side
    fi
    echo "$addr slots=$ranks" >>"$dir/hostfile"
    echo "$addr $ns" >>"$dir/hosts"
  done
  # OpenMPI's rsh agent: `agent HOST COMMAND...` runs COMMAND (a shell command line) in HOST's namespace,
  # in a UTS namespace of its own named after the host, so every process there sees that hostname.
  cat >"$dir/agent" <<EOF
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h || \$2 == h {print \$2}' "$dir/hosts")
[ -n "\$ns" ] || { echo "cluster agent: unknown host \$host" >&2; exit 255; }
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$ns; \$*"
EOF
  chmod +x "$dir/agent"
  # OpenMPI's collectives among 2 ranks (the peers across 2 hosts): its default all-reduce and reduce-scatter
  # ran at 40-60 % of a shaped link (13.3 MB at 100 Mbit/s: 1.6-2.2 s; the link carries 10.8 MB/s each way
  # both ways at once); recursive doubling (all-reduce) and recursive halving (reduce-scatter) run at its rate
  # (1.14-1.28 s, 0.61-0.69 s). OpenMPI's rules file: collective id (2 all-reduce, 13 reduce-scatter-block),
  # communicator sizes, each with its message sizes: "from-bytes algorithm fan-out segment". A communicator
  # takes the rule of the largest size not above its own, so size 3 and up get algorithm 0: OpenMPI's
  # defaults (without it flat MPI at 4 ranks ran recursive doubling: ddp 844 -> 452 tokens/s at 100 Mbit/s).
  printf '%s\n' 2 2 2 2 1 "0 3 0 0" 3 1 "0 0 0 0" 13 2 2 1 "0 3 0 0" 3 1 "0 0 0 0" >"$dir/coll-rules"
  # What mpirun needs to run across the hosts: the hostfile and agent, TCP pinned to the cluster's subnet, the
  # rules above, and no binding: every host's daemon sees the same cores and would bind its first rank to
  # core 0, so with one rank per host every rank of the cluster ran on core 0 while the others idled.
  # The TCP transport sends large messages by its "send" protocol only: with its default put protocol, an
  # exchange of 6.6 MB each way between two hosts at 100 Mbit/s took 0.57 s the first time and 0.98-1.11 s
  # every time after (plain sockets: 0.58-0.67 s every time), and ddp with 2 MiB buckets ran 908-913 tokens/s
  # against 1,434-1,464 with send only (gpt-small, 2 x 1).
  echo "--hostfile $dir/hostfile --mca plm_rsh_agent $dir/agent --mca plm_rsh_no_tree_spawn 1" \
    "--mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.$k.0/24 --mca oob_tcp_if_include 10.77.$k.0/24" \
    "--mca btl_tcp_flags send" \
    "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_dynamic_rules_filename $dir/coll-rules" \
    "--bind-to none" >"$dir/mpirun-flags"
  echo "$hosts $ranks $link" >"$dir/shape"
}

status() {
  local n=$1 dir
  dir=$(state_of "$n")
  [ -f "$dir/shape" ] || { echo "cluster $n: down"; return 0; }
  read -r h r l <"$dir/shape"
  echo "cluster $n: $h host(s), $r rank(s) per host, link $l"
  for ns in $(awk '{print $2}' "$dir/hosts"); do echo "  $ns $(ip -n "$ns" -o -4 addr show eth0 | awk '{print $4}')"; done
  echo "mpirun $(cat "$dir/mpirun-flags")"
}

free_name() {  # the first ssK with no namespace or state yet
  for ((k = 0; k < 100; k++)); do
    if ! ip netns list 2>/dev/null | grep -q "^ss${k}h" && [ ! -e "$(state_of "ss$k")" ]; then
      echo "ss$k"
      return
    fi
  done
  die "no free cluster name (ss0..ss99 all in use; take some down)"
}

case $cmd in
  up)
    need_privileges
    n=${name:-ss0}
    up "$n"
    echo "cluster $n up: $hosts host(s) x $ranks slot(s), link $link" >&2
    echo "mpirun $(cat "$(state_of "$n")/mpirun-flags")"
    ;;
  down)
    need_privileges
    down "${name:-ss0}"
    ;;
  status)
    status "${name:-ss0}"
    ;;
  check)
    need_privileges
    ;;
  exec)
    [ $# -gt 0 ] || die "exec: give the command after --"
    n=${name:-ss0}
    dir=$(state_of "$n")
    [ -x "$dir/agent" ] || die "exec: cluster $n is not up"
    ns=$(ns_of "$n" "$host")
    grep -q " $ns\$" "$dir/hosts" || die "exec: cluster $n has no host $host"
    exec "$dir/agent" "$ns" "$(printf '%q ' "$@")"
    ;;
  run)
    [ $# -gt 0 ] || die "run: give the command after --"
    need_privileges
    n=${name:-$(free_name)}
    # Taken down whatever happens: normal exit, failure, Ctrl-C, a kill from a scheduler.
    trap 'down "$n"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    up "$n"
    root=()
    [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
    # mpirun gives ranks on other hosts only what -x names: the sanitizers' settings and slimshard's cache.
    for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS SLIMSHARD_CACHE CI; do
      [ -n "${!v:-}" ] && root+=(-x "$v")
    done
    # shellcheck disable=SC2046
    set +e
    mpirun "${root[@]}" --oversubscribe $(cat "$(state_of "$n")/mpirun-flags") -n $((hosts * ranks)) "$@"
    rc=$?
    set -e
    exit $rc
    ;;
  *) die "unknown command '$cmd' (up, down, status, check, exec or run)" ;;
esac
