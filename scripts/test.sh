#!/usr/bin/env bash
# The README's test command: installs missing packages, then
#   1. builds the unit tests and the fuzzer with AddressSanitizer and UndefinedBehaviorSanitizer
#      (Debug, -O1) and runs the unit tests except the [heavy] grids, the fault-injection tests,
#      40 fuzz seeds and the MPI tests on 3 ranks (skip with ALIBI_SANITIZE_TESTS=0);
#   2. builds every target in Release (with the CUDA targets when nvcc is found, the PyTorch
#      operators when torch is installed) and runs every ctest test: unit, consumer, example,
#      fuzz (1,000 seeds) and python (alibi_torch) tests;
#   3. builds the API reference (alibi_docs, Doxygen; any warning fails it).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's header and the end print the seconds since the start, to see where CI spends
# its time.
stage() { echo "== [${SECONDS} s] $*"; }
# PyTorch too (ALIBI_WITH_TORCH=0 leaves it out), so that the python-labelled tests of
# alibi_torch run rather than skip.
ALIBI_WITH_TORCH=${ALIBI_WITH_TORCH:-1} scripts/install-deps.sh
jobs=$(nproc)
build=${ALIBI_BUILD_DIR:-build}
# ccache (installed by install-deps.sh) makes a second run on the same machine rebuild only the
# translation units whose preprocessed source changed.
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi

if [ "${ALIBI_SANITIZE_TESTS:-1}" != 0 ]; then
  asan=${build}-asan
  stage "sanitizers: configure and build the unit tests and the fuzzer"
  # One kernels variant (AVX2 and FMA on x86-64) is enough for the sanitizers: the Release
  # build compiles and tests all of them.
  variants=()
  if [ "$(uname -m)" = x86_64 ]; then variants=(-DALIBI_KERNELS_VARIANTS=x86-64-v3); fi
  cmake -S . -B "$asan" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Debug -DALIBI_SANITIZE=ON \
    -DALIBI_BUILD_BENCHMARKS=OFF -DALIBI_BUILD_EXAMPLES=OFF -DALIBI_CUDA=OFF "${variants[@]}"
  cmake --build "$asan" --parallel "$jobs" --target alibi_tests alibi_fuzz alibi_fault_tests
  stage "sanitizers: unit tests (all but the [heavy] grids, which the Release run covers)"
  "$asan/tests/alibi_tests" "~[heavy]"
  stage "sanitizers: every allocation of a call made to fail in turn"
  "$asan/tests/alibi_fault_tests"
  stage "sanitizers: fuzz seeds 0-39"
  "$asan/tests/alibi_fuzz" 0 40
  if command -v mpirun > /dev/null; then
    stage "sanitizers: the MPI tests on 3 ranks (leak checks off: Open MPI keeps its own)"
    cmake --build "$asan" --parallel "$jobs" --target alibi_mpi_ring alibi_mpi_tensor_parallel \
      alibi_mpi_faults
    for t in alibi_mpi_ring alibi_mpi_tensor_parallel alibi_mpi_faults; do
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
        ASAN_OPTIONS=detect_leaks=0 mpirun -np 3 "$asan/tests/$t" | tail -1
    done
  fi
fi

stage "Release: configure and build every target"
cmake -S . -B "$build" -G Ninja "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" --parallel "$jobs"
stage "Release: every ctest test"
ctest --test-dir "$build" --output-on-failure --parallel "$jobs"
stage "API reference (Doxygen, warnings are errors): $build/docs/html/index.html"
cmake --build "$build" --target alibi_docs
stage "done"
