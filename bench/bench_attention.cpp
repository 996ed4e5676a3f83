// SPDX-License-Identifier: MIT
// The fused CPU backend against the fp32 seed algorithm and this machine's sgemm, in one run.
// Counters: GFLOP/s (4 * H * Lq * Lk * D, halved for causal), sgemm_frac (that rate over the
// aggregate GFLOP/s of `threads` concurrent 1024^3 Eigen sgemms) and peak_frac (over the
// aggregate rate of `threads` register-only FMA loops), both measured in this process.
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
  state.counters["peak_frac"] =
      benchmark::Counter(flops / (alibi_bench::fma_peak_gflops(threads) * 1e9),
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
  p.skip_far_tiles = false;  // the dense kernel; BM_far_tiles measures the skipping
  const alibi::backend::eigen be{threads};
  alibi_bench::timed_steps(state, [&] {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  });
  set_counters(state, alibi_bench::attention_flops(16, len, len, d, causal), threads);
}

void BM_seed_fp32(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  alibi_bench::inputs in(16, len, len, d);
  alibi_bench::timed_steps(state, [&] {
    alibi_bench::seed_attention(threads, in, causal);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  });
  set_counters(state, alibi_bench::attention_flops(16, len, len, d, causal), threads);
}

void BM_sgemm_1024(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(alibi_bench::sgemm_gflops(threads));
  state.counters["GFLOP/s"] = alibi_bench::sgemm_gflops(threads);
  state.counters["peak_frac"] =
      alibi_bench::sgemm_gflops(threads) / alibi_bench::fma_peak_gflops(threads);
}

/// The FMA peak of `threads` cores (register-only FMA loops), the ceiling of every rate here.
void BM_fma_peak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(alibi_bench::fma_peak_gflops(threads));
  state.counters["GFLOP/s"] = alibi_bench::fma_peak_gflops(threads);
}

// Args: k_len, threads, skip. One query token against a long KV cache (16 heads, D 128).
void BM_decode(benchmark::State& state) {
  const index_t lk = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  alibi_bench::inputs in(16, 1, lk, 128);
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = state.range(2) != 0;
  const alibi::backend::eigen be{threads};
  alibi_bench::timed_steps(state, [&] {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
  });
  state.counters["KV_GB/s"] = benchmark::Counter(2.0 * 16 * lk * 128 * 4 / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Args: length, skip (0/1), threads. H = 16 (slopes 2^-0.5 .. 2^-8), D = 64, causal: the
// far-tile bound on and off in the same run. Counters: GFLOP/s of the causal work the
// kernel is asked for, and the fraction of key tiles skipped.
void BM_far_tiles(benchmark::State& state) {
  const index_t len = state.range(0);
  const bool skip = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  alibi_bench::inputs in(16, len, len, 64);
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = skip;
  alibi::attention_stats stats;
  p.stats = &stats;
  const alibi::backend::eigen be{threads};
  alibi_bench::timed_steps(state, [&] {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
  });
  set_counters(state, alibi_bench::attention_flops(16, len, len, 64, true), threads);
  state.counters["skipped"] = static_cast<double>(stats.tiles_skipped) /
                              static_cast<double>(stats.tiles_skipped + stats.tiles_computed);
}

// Args: length, head, skip. One head of a 16-head model (slope of that head), D = 64, causal,
// 2 threads: the speedup of the far-tile bound per head.
void BM_far_tiles_head(benchmark::State& state) {
  const index_t len = state.range(0);
  alibi_bench::inputs in(1, len, len, 64);
  alibi::attention_params p;
  p.mask.causal = true;
  p.slopes.global_heads = 16;
  p.slopes.head_offset = state.range(1);
  p.skip_far_tiles = state.range(2) != 0;
  alibi::attention_stats stats;
  p.stats = &stats;
  const alibi::backend::eigen be{2};
  alibi_bench::timed_steps(state, [&] {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
  });
  set_counters(state, alibi_bench::attention_flops(1, len, len, 64, true), 2);
  state.counters["skipped"] = static_cast<double>(stats.tiles_skipped) /
                              static_cast<double>(stats.tiles_skipped + stats.tiles_computed);
}

void attention_args(benchmark::internal::Benchmark* b, index_t max_len) {
  for (int threads : {1, 2})
    for (index_t d : {64, 128})
      for (int causal : {0, 1})
        for (index_t len = 512; len <= max_len; len *= 2) b->Args({d, len, causal, threads});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_fma_peak)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_sgemm_1024)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_fused)->Apply([](benchmark::internal::Benchmark* b) { attention_args(b, 8192); });
// The seed algorithm's L x L score and bias buffers reach 512 MiB per thread at 8192.
BENCHMARK(BM_seed_fp32)->Apply([](benchmark::internal::Benchmark* b) { attention_args(b, 8192); });
BENCHMARK(BM_far_tiles)
    ->ArgsProduct({{2048, 8192, 32768}, {0, 1}, {2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_far_tiles_head)
    ->ArgsProduct({{8192, 32768}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode)
    ->ArgsProduct({{32768}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
