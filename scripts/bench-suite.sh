#!/usr/bin/env bash
# The benchmark suite in one command: the seeds' memory/time-vs-length experiment (embed 512,
# 8 heads, batch 1, L = 128..16384, causal and not) on every path this build has (seed
# algorithm in fp32, fused CPU with 1 thread and with every hardware thread, and the CUDA
# backend in float/half/bfloat16 when built and a GPU is present), median of 3 repetitions,
# JSON into bench/results/suite-<date>/, a table on stdout and the PNG plots into
# docs/plots/ (installs python3-matplotlib if missing).
#   ALIBI_SUITE_QUICK=1  lengths up to 1024, one repetition (what the demo runs)
set -euo pipefail
cd "$(dirname "$0")/.."
plots=1
[ "${ALIBI_SUITE_QUICK:-0}" = 1 ] && plots=0
ALIBI_WITH_PLOTS=$plots scripts/install-deps.sh
build=${ALIBI_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
targets=(alibi_suite)
grep -q "alibi_suite_cuda" "$build/build.ninja" && targets+=(alibi_suite_cuda)
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"

args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
filter=.
if [ "${ALIBI_SUITE_QUICK:-0}" = 1 ]; then
  args=(--benchmark_min_time=0.05)
  filter='L:(128|256|512|1024)/'
fi
out=bench/results/suite-$(date +%Y-%m-%d)
[ "${ALIBI_SUITE_QUICK:-0}" = 1 ] && out=$build/suite-quick
mkdir -p "$out"
jsons=("$out/cpu.json")
"$build/bench/alibi_suite" "${args[@]}" --benchmark_filter="$filter" \
  --benchmark_out="$out/cpu.json" --benchmark_out_format=json >"$out/cpu.log" 2>&1
if [ -x "$build/bench/alibi_suite_cuda" ]; then
  rc=0
  "$build/bench/alibi_suite_cuda" "${args[@]}" --benchmark_filter="$filter" \
    --benchmark_out="$out/gpu.json" --benchmark_out_format=json >"$out/gpu.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then jsons+=("$out/gpu.json"); else echo "(GPU suite skipped: no GPU)"; fi
fi
# Debian's interpreter, where python3-matplotlib lives (another python3 may come first on PATH).
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
if [ "${ALIBI_SUITE_QUICK:-0}" = 1 ]; then
  "$py" scripts/suite_report.py "${jsons[@]}"
else
  "$py" scripts/suite_report.py "${jsons[@]}" --plots docs/plots
  echo "JSON in $out"
fi
