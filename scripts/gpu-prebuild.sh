#!/usr/bin/env bash
# Builds the GPU check's binaries (CUDA tests, benchmarks, suite, example) on a machine with
# nvcc but no GPU, for the architecture given (default 90), into .gpu-bin/ (git-ignored), so
# that a GPU machine spends its time running them rather than compiling:
#   scripts/gpu-prebuild.sh [arch]  then, there,  ALIBI_GPU_PREBUILT=.gpu-bin scripts/gpu-check.sh
# Host code is built without -march=native (the GPU machine's processor may differ).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90}
build=build-gpu-pre
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DALIBI_NATIVE=OFF -DALIBI_CUDA=ON >/dev/null
cmake --build "$build" --target alibi_cuda_tests alibi_cuda_bench alibi_suite_cuda \
  alibi_example_cuda_attention
# The MPI test with backend::cuda, where MPI is installed (the target exists then).
mpi=
targets=$(cmake --build "$build" --target help)
if grep -q '^alibi_mpi_ring_cuda:' <<<"$targets"; then
  cmake --build "$build" --target alibi_mpi_ring_cuda
  mpi=$build/tests/alibi_mpi_ring_cuda
else
  echo "no MPI here: the MPI test with backend::cuda is left out"
fi
rm -rf .gpu-bin
mkdir -p .gpu-bin
cp "$build/tests/alibi_cuda_tests" "$build/bench/alibi_cuda_bench" "$build/bench/alibi_suite_cuda" \
  "$build/examples/alibi_example_cuda_attention" $mpi .gpu-bin/
du -sh .gpu-bin
# Packed for the copy to a GPU machine; scripts/gpu-check.sh unpacks it there.
. scripts/gpu/archive.sh
pack .gpu-bin
echo "built for sm_$arch from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)') on $(date -u +%F)" >.gpu-bin/built.txt
du -sh .gpu-bin
# What travels to the GPU machine: the repository's files (tracked, or untracked and not
# ignored) with .gpu-deps and .gpu-bin.
bytes=$({ git ls-files -z --cached --others --exclude-standard
  find .gpu-deps .gpu-bin -type f -print0 2>/dev/null; } | du -cb --files0-from=- | tail -1 | cut -f1)
echo "the working tree with .gpu-deps and .gpu-bin: $((bytes >> 20)) MiB"
