#!/usr/bin/env bash
# Runs every libFuzzer harness built in BUILD for SECONDS each, from the seed corpus in tests/fuzz/corpus/
# (copied, so the repository's corpus stays as committed), and prints executions per harness and in total.
# Exits non-zero if any harness finds a failure (its reproducer is left in BUILD/fuzz-out/<target>/).
#   scripts/fuzz.sh build-fuzz 60
set -euo pipefail
build=$(cd "${1:?usage: scripts/fuzz.sh BUILD SECONDS}" && pwd); seconds=${2:-60}
here=$(cd "$(dirname "$0")/.." && pwd)
total=0; failed=0
for bin in "$build"/fuzz_*; do
  [ -x "$bin" ] || continue
  t=${bin##*/fuzz_}
  work="$build/fuzz-out/$t"; rm -rf "$work"; mkdir -p "$work/corpus"
  cp "$here/tests/fuzz/corpus/$t"/* "$work/corpus/" 2>/dev/null || true
  log="$work/log.txt"
  if (cd "$work" && "$bin" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=4096 -timeout=20 \
        corpus >"$log" 2>&1); then status=ok; else status=FAILED; failed=1; fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  total=$((total + runs))
  printf '%-18s %10s executions  %s\n' "$t" "$runs" "$status"
  [ "$status" = ok ] || tail -30 "$log"
done
printf '%-18s %10s executions in all\n' total "$total"
exit $failed
