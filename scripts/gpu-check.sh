#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA GPU, nvcc, CMake, ninja and python3 with PyTorch
# but without Eigen, Catch2 or Google Benchmark (run scripts/gpu-deps.sh on a machine that has
# them and bring .gpu-deps along). In about 4 minutes with prebuilt binaries (6 building) it:
#   1. times PyTorch's SDPA-with-bias and FlexAttention-ALiBi in the background while nvcc
#      builds and the tests run (no timing of ours overlaps it), bounded by
#      ALIBI_TORCH_BUDGET seconds;
#   2. builds the CUDA tests, benchmarks and example for this GPU's architecture, or uses
#      the binaries in $ALIBI_GPU_PREBUILT (scripts/gpu-prebuild.sh makes them on a machine
#      without a GPU) when they run here;
#   3. runs the `cuda`-labelled tests and the CUDA example;
#   4. runs compute-sanitizer memcheck and racecheck on the [sanitize] subset, and the MPI
#      test with backend::cuda (alibi_mpi_ring_cuda, prebuilt only: 1-3 ranks on this GPU,
#      under the Open MPI that scripts/gpu-deps.sh bundles, relocated with OPAL_PREFIX);
#   5. runs the GPU benchmarks (median of 3; ALIBI_BENCH_FILTER selects some) and prints them
#      beside PyTorch with the ratios, then the seeds' suite on the GPU (ALIBI_SUITE=0 leaves
#      it out).
# Results go to $ALIBI_GPU_RESULTS (default gpu-check-results/). Set ALIBI_SKIP_TORCH=1 to
# leave out step 1.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${ALIBI_GPU_RESULTS:-gpu-check-results}
mkdir -p "$results"
prefix=$PWD/.gpu-deps/usr
pre=${ALIBI_GPU_PREBUILT:-}
# scripts/gpu-deps.sh and gpu-prebuild.sh pack their folders for the copy to this machine.
. scripts/gpu/archive.sh
for d in .gpu-deps $pre; do unpack "$d" || echo "could not unpack $d/packed.tar.xz"; done
cuda_lib=
if command -v nvcc >/dev/null; then
  cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
  cuda_lib=$cuda_root/lib64:$cuda_root/lib:
fi
export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu:$cuda_lib${LD_LIBRARY_PATH:-}
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

# The binaries: prebuilt ones when they start here, else built for this GPU.
bin=build-gpu
tests=$bin/tests/alibi_cuda_tests
bench=$bin/bench/alibi_cuda_bench
suite=$bin/bench/alibi_suite_cuda
example=$bin/examples/alibi_example_cuda_attention
mpi_test=
starts() { "$pre/alibi_cuda_bench" --help >/dev/null 2>&1 && "$pre/alibi_cuda_tests" --help >/dev/null 2>&1; }
if [ -n "$pre" ] && starts; then
  step "prebuilt binaries from $pre"
  tests=$pre/alibi_cuda_tests bench=$pre/alibi_cuda_bench suite=$pre/alibi_suite_cuda
  example=$pre/alibi_example_cuda_attention
  [ -x "$pre/alibi_mpi_ring_cuda" ] && mpi_test=$pre/alibi_mpi_ring_cuda
  cat "$pre/built.txt" 2>/dev/null
else
  [ -n "$pre" ] && { echo "prebuilt binaries in $pre do not start here:"; ldd "$pre/alibi_cuda_tests" "$pre/alibi_cuda_bench" | grep "not found"; }
  step "configure and build (sm_$arch)"
  mkdir -p build-gpu
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DALIBI_NATIVE=OFF \
    -DALIBI_CUDA=ON >build-gpu/configure.log 2>&1 || { cat build-gpu/configure.log; exit 1; }
  cmake --build build-gpu --target alibi_cuda_tests alibi_cuda_bench alibi_suite_cuda \
    alibi_example_cuda_attention -j "$(nproc)" >build-gpu/build.log 2>&1 ||
    { tail -50 build-gpu/build.log; exit 1; }
fi

step "cuda tests"
# The `cuda`-labelled ctest tests, run as ctest runs them, the four at once (their time is
# the double-precision oracle's, on the host's cores). A test that runs past its limit (a
# kernel that hangs) ends the check: everything after it would hang too.
# ALIBI_TEST_GROUPS (';'-separated Catch2 filters) runs some of them only; each group may
# take ALIBI_TEST_TIMEOUT seconds (the [skip] group took about 140 s beside PyTorch's compile).
IFS=';' read -r -a filters <<<"${ALIBI_TEST_GROUPS:-[skip];[grid];~[grid]~[layers]~[skip];[layers]}"
pids=()
for n in "${!filters[@]}"; do
  timeout "${ALIBI_TEST_TIMEOUT:-240}" "$tests" "${filters[$n]}" -d yes >"$results/tests.$n.log" 2>&1 &
  pids+=($!)
done
hung=0
for n in "${!filters[@]}"; do
  wait "${pids[$n]}"
  rc=$?
  { echo "--- alibi_cuda_tests ${filters[$n]}"; cat "$results/tests.$n.log"; } >>"$results/tests.log"
  rm -f "$results/tests.$n.log"
  [ $rc -ne 0 ] && { echo "FAILED ($rc): ${filters[$n]}"; status=1; }
  [ $rc -eq 124 ] && hung=1
done
grep -E "^--- |Passed|Failed|Skipped|test cases|assertions" "$results/tests.log"
grep -B2 -A14 "FAILED:" "$results/tests.log" | head -150
[ $hung = 1 ] && exit 1

step "CUDA example"
timeout 60 "$example" || status=1

step "compute-sanitizer memcheck and racecheck ([sanitize] subset)"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$tests" "[sanitize]" >"$results/$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc"
  tail -5 "$results/$tool.log"
  [ $rc -ne 0 ] && status=1
done

step "MPI with backend::cuda (ring and all-to-all, 1-3 ranks sharing this GPU)"
if [ -z "$mpi_test" ]; then
  echo "skipped: no prebuilt alibi_mpi_ring_cuda (scripts/gpu-prebuild.sh builds it where MPI is installed)"
elif [ ! -x "$prefix/bin/mpirun" ] && ! command -v mpirun >/dev/null; then
  echo "skipped: no mpirun (scripts/gpu-deps.sh bundles Open MPI's run time)"
else
  for np in 1 2 3; do
    # The bundled Open MPI when present: OPAL_PREFIX relocates its plugins and help files.
    # Shared memory and self transports only; plugins whose libraries this machine lacks
    # are skipped quietly.
    (
      if [ -x "$prefix/bin/mpirun" ]; then
        export OPAL_PREFIX=$prefix PATH=$prefix/bin:$PATH
        export LD_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu/openmpi/lib:$LD_LIBRARY_PATH
        # PMIx does not follow OPAL_PREFIX: its plugins' folder is named.
        export PMIX_MCA_mca_base_component_path=$prefix/lib/x86_64-linux-gnu/pmix2/lib/pmix
      fi
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
        OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_show_load_errors=0 \
        timeout 120 mpirun -np "$np" "$mpi_test" >"$results/mpi_cuda.$np.log" 2>&1
    )
    rc=$?
    echo "$np ranks: exit $rc"
    grep -E "FAILED|failed checks|SKIPPED|rror" "$results/mpi_cuda.$np.log" | head -20
    [ $rc -ne 0 ] && { status=1; tail -5 "$results/mpi_cuda.$np.log"; }
  done
fi

if [ -n "$torch_pid" ]; then
  step "waiting for PyTorch"
  wait "$torch_pid" || echo "PyTorch timings exited with $?"
  cat "$results/torch.log"
fi

step "GPU benchmarks"
timeout 300 "$bench" --benchmark_min_time=0.1 --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$results/bench.json" \
  --benchmark_filter="${ALIBI_BENCH_FILTER:-.}" \
  --benchmark_out_format=json 2>&1 | grep -E "median|^Run|^---|^Benchmark|rror" || status=1
if [ "${ALIBI_SUITE:-1}" != 0 ]; then
  step "the seeds' suite on the GPU (median of 3)"
  timeout 120 "$suite" --benchmark_min_time=0.05 --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$results/suite.json" \
    --benchmark_out_format=json >"$results/suite.log" 2>&1
  rc=$?
  grep -E "median|rror" "$results/suite.log"
  if [ $rc -ne 0 ]; then
    status=1
    echo "alibi_suite_cuda exited with $rc; its output ends:"
    tail -5 "$results/suite.log"
    echo "the first case under compute-sanitizer:"
    timeout 60 compute-sanitizer --tool memcheck "$suite" --benchmark_min_time=0.01 \
      --benchmark_filter='suite/cuda_bf16/L:128/causal:1/' 2>&1 | tail -25
  fi
fi
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
  step "Nsight Compute on bf16 D=128 causal L=16384, skipping off and on"
  for skip in 0 1; do
    timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats -k regex:attention_kernel -c 1 \
      "$bench" --benchmark_min_time=0.01 \
      --benchmark_filter="BM_cuda_attention<__nv_bfloat16>/D:128/L:16384/causal:1/skip:$skip" \
      >"$results/ncu.$skip.txt" 2>&1
    echo "--- skip $skip"
    grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Warp Cycles|Stall|Block Limit|One or More|Issue" "$results/ncu.$skip.txt" | head -40
  done
fi
step "alibi vs PyTorch"
python3 scripts/gpu/compare.py "$results/bench.json" "$results/torch.json" || status=1
exit $status
