#!/usr/bin/env bash
# Installs what slimshard needs to build, test and run, from Debian packages only.
# Idempotent: installs nothing when everything is present. Quiet on success, loud on failure.
set -euo pipefail

packages=(
  build-essential cmake make
  libtorch-dev                       # tensors, autograd, kernels
  libopenblas0-openmp                # fast BLAS for LibTorch: the default reference BLAS measured 6 vs 86 GFLOP/s
  libopenmpi-dev openmpi-bin         # communication and launch
  nlohmann-json3-dev libcli11-dev    # JSON, command line
  zlib1g-dev                         # gzip IDX files
  googletest libgtest-dev            # tests
  bible-kjv dataset-fashion-mnist    # real data
  python3-torch                      # PyTorch: the export check (tests/export_check.py) and the DDP peer (bench)
  clang libclang-rt-14-dev           # make fuzz: libFuzzer and the sanitizer runtimes for clang
  procps                             # pkill, for the preemption tests
  iproute2                           # ip, tc: scripts/cluster.sh (hosts as network namespaces)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
log=$(mktemp)
echo "install-deps: installing ${missing[*]}" >&2
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-deps: FAILED to install: ${missing[*]} (apt-get output above)" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
