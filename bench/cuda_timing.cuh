// SPDX-License-Identifier: MIT
// Shared by the GPU benchmarks: CUDA error checking and timing with CUDA events.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace alibi_bench {

/// Exits with the CUDA error's name and where it came from (on stdout too, which the GPU
/// check keeps when the benchmark's own output is filtered).
inline void ok(cudaError_t e, const char* what = "a CUDA call") {
  if (e != cudaSuccess) {
    std::fflush(stdout);
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::fflush(stdout);
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Times `f` with CUDA events: one warm-up call, then one timed call per iteration (use
/// with UseManualTime()).
template <class F>
void time_cuda(benchmark::State& state, F&& f) {
  cudaEvent_t start, stop;
  ok(cudaEventCreate(&start));
  ok(cudaEventCreate(&stop));
  f();
  ok(cudaDeviceSynchronize());
  for (auto _ : state) {
    ok(cudaEventRecord(start));
    f();
    ok(cudaEventRecord(stop));
    ok(cudaEventSynchronize(stop));
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, start, stop));
    state.SetIterationTime(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace alibi_bench
