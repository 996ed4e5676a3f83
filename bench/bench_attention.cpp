// SPDX-License-Identifier: MIT
// The fused CPU backend against the fp32 seed algorithm and this machine's sgemm, in one run.
// Counters: GFLOP/s (4 * H * Lq * Lk * D, halved for causal) and sgemm_frac (that rate over
// the aggregate GFLOP/s of `threads` concurrent 1024^3 Eigen sgemms, measured in this process).
#include <benchmark/benchmark.h>

#include "common.hpp"

namespace {

using alibi_bench::index_t;

void set_counters(benchmark::State& state, double flops, int threads) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sgemm_frac"] =
      benchmark::Counter(flops / (alibi_bench::sgemm_gflops(threads) * 1e9),
                         benchmark::Counter::kIsIterationInvariantRate);
}

// Args: head_dim, length, causal, threads.
void BM_fused(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  alibi_bench::inputs in(16, len, len, d);
  alibi::attention_params p;
  p.mask.causal = causal;
  const alibi::backend::eigen be{threads};
  for (auto _ : state) {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, alibi_bench::attention_flops(16, len, len, d, causal), threads);
}

void BM_seed_fp32(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  alibi_bench::inputs in(16, len, len, d);
  for (auto _ : state) {
    alibi_bench::seed_attention(threads, in, causal);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  set_counters(state, alibi_bench::attention_flops(16, len, len, d, causal), threads);
}

void BM_sgemm_1024(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(alibi_bench::sgemm_gflops(threads));
  state.counters["GFLOP/s"] = alibi_bench::sgemm_gflops(threads);
}

// Args: k_len, threads. One query token against a long KV cache (16 heads, D 128).
void BM_decode(benchmark::State& state) {
  const index_t lk = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  alibi_bench::inputs in(16, 1, lk, 128);
  alibi::attention_params p;
  p.mask.causal = true;
  const alibi::backend::eigen be{threads};
  for (auto _ : state) {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
  }
  state.counters["KV_GB/s"] = benchmark::Counter(2.0 * 16 * lk * 128 * 4 / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void attention_args(benchmark::internal::Benchmark* b, index_t max_len) {
  for (int threads : {1, 2})
    for (index_t d : {64, 128})
      for (int causal : {0, 1})
        for (index_t len = 512; len <= max_len; len *= 2) b->Args({d, len, causal, threads});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_sgemm_1024)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_fused)->Apply([](benchmark::internal::Benchmark* b) { attention_args(b, 8192); });
// The seed algorithm's L x L score and bias buffers reach 512 MiB per thread at 8192.
BENCHMARK(BM_seed_fp32)->Apply([](benchmark::internal::Benchmark* b) { attention_args(b, 8192); });
BENCHMARK(BM_decode)
    ->Args({32768, 1})
    ->Args({32768, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
