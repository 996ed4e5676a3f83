#!/usr/bin/env bash
# Same-run comparison of two alibi_bench binaries (e.g. before/after a change): for each
# benchmark name pattern, the two binaries run alternately ROUNDS times (3 repetitions each,
# median), and the script prints the median time of each and new/old.
#   bench/scripts/bench-compare.sh OLD_BIN NEW_BIN [ROUNDS] PATTERN...
# Example (build the old commit in a worktree first):
#   bench/scripts/bench-compare.sh /tmp/old/build/bench/alibi_bench build/bench/alibi_bench 4 \
#     'BM_fused/64/1024/0/2/' 'BM_decode/32768/1/0'
set -euo pipefail
old=$1 new=$2
shift 2
rounds=4
if [[ ${1:-} =~ ^[0-9]+$ ]]; then rounds=$1; shift; fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
run() {
  "$1" --benchmark_filter="$2" --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json 2>/dev/null |
    python3 -c 'import json, sys
print([b["real_time"] for b in json.load(sys.stdin)["benchmarks"] if b.get("aggregate_name") == "median"][0])'
}
printf '%-32s %12s %12s %8s\n' pattern old new new/old
for pattern in "$@"; do
  o=() n=()
  for ((r = 0; r < rounds; r++)); do
    o+=("$(run "$old" "$pattern")")
    n+=("$(run "$new" "$pattern")")
  done
  mo=$(printf '%s\n' "${o[@]}" | median)
  mn=$(printf '%s\n' "${n[@]}" | median)
  printf '%-32s %12.3f %12.3f %8.3f\n' "$pattern" "$mo" "$mn" "$(awk -v a="$mo" -v b="$mn" 'BEGIN {print b / a}')"
done
