#!/usr/bin/env bash
# The benchmark suite in one command: the seeds' memory/time-vs-length experiment (embed 512,
# 8 heads, batch 1, L = 128..16384, causal and not) on every path this build has (seed
# algorithm in fp32, fused CPU with 1 thread and with every hardware thread, and the CUDA
# backend in float/half/bfloat16 when built and a GPU is present), median of 3 repetitions.
# Prints one progress line per case (with the elapsed time), then a table. Writes the JSON,
# the logs and the PNG plots into <build>/suite-<date>/ (installs python3-matplotlib if
# missing); the committed results are left alone unless asked:
#   --update-plots   JSON into bench/results/suite-<date>/ and the plots into docs/plots/
#   --quick          lengths up to 1024, one repetition, no plots (what the demo runs; also
#                    ALIBI_SUITE_QUICK=1), into <build>/suite-quick/
#   --with-torch     install Debian's python3-torch if missing; the CPU peer (PyTorch's
#                    BLOOM-style eager attention, bench/scripts/torch_cpu_suite.py, L <= 8192) runs
#                    whenever torch imports, and is a line in the table and plots
# The build directory is build unless ALIBI_BUILD_DIR says otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=${ALIBI_SUITE_QUICK:-0}
update=0
with_torch=0
for arg in "$@"; do
  case "$arg" in
    --update-plots) update=1 ;;
    --quick) quick=1 ;;
    --with-torch) with_torch=1 ;;
    -h | --help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "bench-suite.sh: unknown argument '$arg' (expected --update-plots, --quick, --with-torch or --help)" >&2
      exit 2
      ;;
  esac
done
if [ "$quick" = 1 ] && [ "$update" = 1 ]; then
  echo "bench-suite.sh: --update-plots needs the full suite, not --quick / ALIBI_SUITE_QUICK=1" >&2
  exit 2
fi
plots=1
[ "$quick" = 1 ] && plots=0
ALIBI_WITH_PLOTS=$plots ALIBI_WITH_TORCH=$with_torch scripts/install-deps.sh
build=${ALIBI_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
# The CUDA suite only where it can run: built (nvcc found) and a GPU present.
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1 && gpu=1
targets=(alibi_suite)
[ $gpu = 1 ] && grep -q "alibi_suite_cuda" "$build/build.ninja" && targets+=(alibi_suite_cuda)
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"

args=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)
filter=.
if [ "$quick" = 1 ]; then
  args=(--benchmark_min_time=0.05)
  filter='L:(128|256|512|1024)/'
fi
if [ "$update" = 1 ]; then
  out=bench/results/suite-$(date +%Y-%m-%d)
  plot_dir=docs/plots
elif [ "$quick" = 1 ]; then
  out=$build/suite-quick
else
  out=$build/suite-$(date +%Y-%m-%d)
  plot_dir=$out/plots
fi
mkdir -p "$out"

# Runs one suite binary: the full output goes to LOG, and each finished case (the median of
# its repetitions, or its single run) is printed as one line with the elapsed time.
line_buffered=()
command -v stdbuf >/dev/null 2>&1 && line_buffered=(stdbuf -oL)
run_suite() {
  local binary=$1 json=$2 log=$3
  "${line_buffered[@]}" "$binary" "${args[@]}" --benchmark_filter="$filter" \
    --benchmark_out="$json" --benchmark_out_format=json 2>&1 | tee "$log" | progress
}
start=$SECONDS
progress() {
  local name time unit rest
  while read -r name time unit rest; do
    [[ "$name" == suite/* && "$time" =~ ^[0-9.]+$ ]] || continue
    [[ "$name" =~ _(mean|stddev|cv)$ ]] && continue
    name=${name%_median}
    name=${name//\/process_time/}
    name=${name//\/real_time/}
    printf '[%5d s] %-44s %10s %s\n' $((SECONDS - start)) "$name" "$time" "$unit"
  done
}

echo "== CPU suite ($out/cpu.log)"
jsons=("$out/cpu.json")
run_suite "$build/bench/alibi_suite" "$out/cpu.json" "$out/cpu.log"
if [ $gpu = 1 ] && [ -x "$build/bench/alibi_suite_cuda" ]; then
  echo "== GPU suite ($out/gpu.log)"
  rc=0
  run_suite "$build/bench/alibi_suite_cuda" "$out/gpu.json" "$out/gpu.log" || rc=$?
  if [ $rc -eq 0 ]; then jsons+=("$out/gpu.json"); else echo "(GPU suite failed: see $out/gpu.log)"; fi
fi
# Debian's interpreter, where python3-matplotlib and python3-torch live (another python3 may
# come first on PATH).
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
if "$py" -c "import torch" 2>/dev/null; then
  echo "== CPU peer: PyTorch BLOOM-style eager attention ($out/torch.log)"
  torch_args=(--out "$out/torch.json")
  [ "$quick" = 1 ] && torch_args+=(--lengths 128,256,512,1024 --repetitions 1)
  rc=0
  "$py" bench/scripts/torch_cpu_suite.py "${torch_args[@]}" 2>&1 | tee "$out/torch.log" || rc=$?
  if [ $rc -eq 0 ]; then jsons+=("$out/torch.json"); else echo "(PyTorch peer failed: see $out/torch.log)"; fi
else
  echo "== CPU peer skipped: python3-torch is not installed (--with-torch installs it)"
fi
echo "== suite finished in $((SECONDS - start)) s"
if [ "$quick" = 1 ]; then
  "$py" bench/scripts/suite_report.py "${jsons[@]}"
else
  mkdir -p "$plot_dir"
  "$py" bench/scripts/suite_report.py "${jsons[@]}" --plots "$plot_dir"
  echo "JSON in $out, plots in $plot_dir"
fi
