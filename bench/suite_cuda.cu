// SPDX-License-Identifier: MIT
// The seeds' experiment on the GPU: the configuration of bench/suite.cpp (embed 512, 8 heads
// of 64, batch 1, L = 128..16384, causal and not) through the CUDA backend in float, half
// and bfloat16. Time from CUDA events; GFLOP/s; peak extra device memory: the high-water
// mark of the only memory the backend allocates (its split-KV workspace pool), reset before
// the call. `tensors_MiB` is the size of q, k, v and out.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>

#include <cstdio>
#include <cstdlib>
#include <vector>
#include "cuda_timing.cuh"

namespace {

using alibi::index_t;
using alibi_bench::ok;
using alibi_bench::time_cuda;
constexpr index_t heads = 8, dim = 64;

template <class T>
void BM_suite_cuda(benchmark::State& state) {
  const index_t len = state.range(0);
  const bool causal = state.range(1) != 0;
  const std::size_t n = static_cast<std::size_t>(heads * len * dim);
  std::vector<T> host(n);
  unsigned x = 7;
  for (auto& e : host) {
    x = x * 1664525u + 1013904223u;
    e = alibi::cuda_detail::elem<T>::from_float(static_cast<float>(x >> 8) / 16777216.0f - 0.5f);
  }
  T *q, *k, *v, *out;
  for (T** p : {&q, &k, &v, &out}) {
    ok(cudaMalloc(p, n * sizeof(T)), "cudaMalloc");
    ok(cudaMemcpy(*p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  alibi::attention_params params;
  params.mask.causal = causal;
  auto run = [&] {
    alibi::attention(alibi::backend::cuda{}, alibi::make_view<const T>(q, 1, heads, len, dim),
                     alibi::make_view<const T>(k, 1, heads, len, dim),
                     alibi::make_view<const T>(v, 1, heads, len, dim),
                     alibi::make_view(out, 1, heads, len, dim), params);
  };
  int device = 0;
  ok(cudaGetDevice(&device), "cudaGetDevice");
  cudaMemPool_t pool = alibi::cuda_detail::workspace_pool(device);
  std::uint64_t zero = 0, high = 0;
  ok(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero),
     "cudaMemPoolSetAttribute(UsedMemHigh)");
  run();  // the measured call (time_cuda's warm-up repeats it)
  ok(cudaDeviceSynchronize(), "the first call");
  ok(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high),
     "cudaMemPoolGetAttribute(UsedMemHigh)");
  time_cuda(state, run);
  state.counters["GFLOP/s"] = benchmark::Counter(
      4.0 * heads * static_cast<double>(len) * len * dim * (causal ? 0.5 : 1.0) / 1e9,
      benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_extra_MiB"] = static_cast<double>(high) / (1 << 20);
  state.counters["tensors_MiB"] = 4.0 * n * sizeof(T) / (1 << 20);
  for (T* p : {q, k, v, out}) cudaFree(p);
}

void suite_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"L", "causal"});
  for (int causal : {1, 0})
    for (index_t len = 128; len <= 16384; len *= 2) b->Args({len, causal});
  b->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_suite_cuda, __nv_bfloat16)->Name("suite/cuda_bf16")->Apply(suite_args);
BENCHMARK_TEMPLATE(BM_suite_cuda, __half)->Name("suite/cuda_fp16")->Apply(suite_args);
BENCHMARK_TEMPLATE(BM_suite_cuda, float)->Name("suite/cuda_fp32")->Apply(suite_args);

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("alibi_suite_cuda: SKIPPED, no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
