#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU, nvcc, CMake, ninja and python3 with PyTorch
# but without Eigen, Catch2 or Google Benchmark (run scripts/gpu-deps.sh on a machine that has
# them and bring .gpu-deps along). In about 6 minutes it:
#   1. times PyTorch's SDPA-with-bias and FlexAttention-ALiBi in the background while nvcc
#      builds (the GPU is idle then), bounded by ALIBI_TORCH_BUDGET seconds;
#   2. builds the CUDA tests and benchmarks for this GPU's architecture;
#   3. runs the `cuda`-labelled tests;
#   4. runs compute-sanitizer memcheck and racecheck on the [sanitize] subset;
#   5. runs the GPU benchmarks (median of 3) and prints them beside PyTorch with the ratios.
# Results go to $ALIBI_GPU_RESULTS (default gpu-check-results/). Set ALIBI_SKIP_TORCH=1 to
# leave out step 1.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${ALIBI_GPU_RESULTS:-gpu-check-results}
mkdir -p "$results"
prefix=$PWD/.gpu-deps/usr
export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)
arch=${arch:-90}

torch_pid=
if [ "${ALIBI_SKIP_TORCH:-0}" != 1 ]; then
  step "PyTorch SDPA/FlexAttention timings (background)"
  PYTHONUNBUFFERED=1 timeout 300 python3 scripts/gpu/torch_alibi_bench.py \
    --budget "${ALIBI_TORCH_BUDGET:-120}" --out "$results/torch.json" >"$results/torch.log" 2>&1 &
  torch_pid=$!
fi

step "configure and build (sm_$arch)"
mkdir -p build-gpu
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DALIBI_BUILD_EXAMPLES=OFF -DALIBI_NATIVE=OFF \
  -DALIBI_CUDA=ON >build-gpu/configure.log 2>&1 || { cat build-gpu/configure.log; exit 1; }
cmake --build build-gpu --target alibi_cuda_tests alibi_cuda_bench -j "$(nproc)" \
  >build-gpu/build.log 2>&1 || { tail -50 build-gpu/build.log; exit 1; }

if [ -n "$torch_pid" ]; then
  step "waiting for PyTorch"
  wait "$torch_pid" || echo "PyTorch timings exited with $?"
  cat "$results/torch.log"
fi

step "cuda tests"
timeout 240 ctest --test-dir build-gpu -L cuda --output-on-failure >"$results/tests.log" 2>&1 || status=1
grep -E "Passed|Failed|Skipped|test cases|assertions" "$results/tests.log"
grep -A14 "FAILED:" "$results/tests.log" | head -150

step "compute-sanitizer memcheck and racecheck ([sanitize] subset)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    build-gpu/tests/alibi_cuda_tests "[sanitize]" >"$results/$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc"
  tail -5 "$results/$tool.log"
  [ $rc -ne 0 ] && status=1
done

step "GPU benchmarks"
timeout 240 build-gpu/bench/alibi_cuda_bench --benchmark_min_time=0.1 --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$results/bench.json" \
  --benchmark_out_format=json 2>&1 | grep -E "median|^Run|^---|^Benchmark" || status=1
if [ "${ALIBI_EXPLORE:-0}" = 1 ]; then
  step "kernel configuration variants (key shapes)"
  deps_lib=$prefix/lib/x86_64-linux-gnu
  # name:kernel_tuning arguments (Warps, MTiles, MinBlocks[, BlockNWide[, QRegsLimit]]),
  # passed by the benchmark to cuda_detail::launch (see ALIBI_BENCH_TUNING in bench_cuda.cu).
  variants=("mi1_w4_b2:4,1,2"
    "mi2_w4_b1_bn64:4,2,1,64"
    "mi2_w4_b1_bn32:4,2,1,32"
    "mi1_w8_b1:8,1,1")
  for v in "${variants[@]}"; do
    name=${v%%:*}
    nvcc -O3 -std=c++17 -arch=sm_$arch -DALIBI_BENCH_TUNING="${v#*:}" -Iinclude -I"$prefix/include" bench/bench_cuda.cu \
      -L"$deps_lib" -l:libbenchmark.so.1.7.1 -lcublas -Xlinker -rpath="$deps_lib" \
      -o "build-gpu/bench_$name" &
  done
  wait
  for v in "${variants[@]}"; do
    name=${v%%:*}
    echo "--- $name"
    timeout 60 "build-gpu/bench_$name" --benchmark_min_time=0.05 --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true \
      --benchmark_filter='BM_cuda_attention<__nv_bfloat16>/D:(64|128)/L:(2048|8192)/causal:(0|1)|BM_cuda_decode<__nv_bfloat16>' \
      2>&1 | grep median | sed 's/manual_time_median//'
  done
fi
if [ "${ALIBI_NCU:-0}" = 1 ]; then
  step "Nsight Compute on bf16 D=128 causal L=8192"
  timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section LaunchStats -k regex:attention_kernel -c 1 \
    build-gpu/bench/alibi_cuda_bench --benchmark_min_time=0.01 \
    --benchmark_filter='BM_cuda_attention<__nv_bfloat16>/D:128/L:8192/causal:1' >"$results/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Warp Cycles|Stall|Block Limit|One or More|Issue" "$results/ncu.txt" | head -40
fi

step "alibi vs PyTorch"
python3 scripts/gpu/compare.py "$results/bench.json" "$results/torch.json" || status=1
exit $status
