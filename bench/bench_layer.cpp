// SPDX-License-Identifier: MIT
// The Transformer layer forward on the CPU (issue: layers): B = 1, embed 1024, 16 heads
// (head_dim 64), ff 4096, post-norm with GELU, L = 512..8192. Reports the time split into
// projections, attention, FFN and LayerNorms (layer_timings), the GEMM parts' GFLOP/s and
// their fraction of this machine's sgemm throughput measured in the same process. Also the
// layers of the ALiBi model families (alibi::families) at the same sizes, L = 2048, causal.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using alibi::index_t;
constexpr index_t E = 1024, H = 16, F = 4096;

alibi::layer_config seed_layer() {
  alibi::layer_config c;
  c.attention.embed_dim = E;
  c.attention.q_heads = H;
  c.ff_dim = F;
  return c;
}

alibi::transformer_layer<float, alibi::backend::eigen> make_layer(
    int threads, const alibi::layer_config& c = seed_layer()) {
  alibi::transformer_layer<float, alibi::backend::eigen> layer(c, alibi::backend::eigen{threads});
  std::mt19937 rng(1);
  for (const auto& p : layer.parameters()) {
    index_t n = 1;
    for (index_t e : p.shape) n *= e;
    std::normal_distribution<float> d(0.0f, p.shape.size() == 2 ? 1.0f / 32.0f : 0.02f);
    std::vector<float> w(static_cast<std::size_t>(n));
    for (float& v : w) v = d(rng);
    if (p.name.find("norm") == std::string::npos) layer.set(p.name, w.data(), p.shape);
  }
  return layer;
}

void report(benchmark::State& state, const alibi::layer_timings& t) {
  const double n = static_cast<double>(state.iterations());
  const double total = t.projections + t.attention + t.ffn + t.norms;
  state.counters["proj_ms"] = 1e3 * t.projections / n;
  state.counters["attn_ms"] = 1e3 * t.attention / n;
  state.counters["ffn_ms"] = 1e3 * t.ffn / n;
  state.counters["norm_ms"] = 1e3 * t.norms / n;
  state.counters["attn_share"] = t.attention / total;
}

/// Times layer.forward on x (L tokens) into y with `opt`, reports the time per part and returns
/// those times summed over the timed iterations.
template <class Layer>
alibi::layer_timings time_forward(benchmark::State& state, Layer& layer, index_t L,
                                  const std::vector<float>& x, std::vector<float>& y,
                                  alibi::forward_options opt) {
  alibi::layer_timings t;
  opt.timings = &t;
  alibi_bench::timed_steps(
      state,
      [&] {
        layer.forward(alibi::make_view<const float>(x.data(), 1, L, E),
                      alibi::make_view(y.data(), 1, L, E), opt);
        benchmark::DoNotOptimize(y.data());
      },
      [&] { t = {}; });
  report(state, t);
  return t;
}

// Args: length, causal, threads, far-tile skipping.
void BM_layer(benchmark::State& state) {
  const index_t L = state.range(0);
  const bool causal = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  auto layer = make_layer(threads);
  std::mt19937 rng(2);
  std::vector<float> x(static_cast<std::size_t>(L * E)), y(x.size());
  std::normal_distribution<float> randn;
  for (float& v : x) v = randn(rng);
  alibi::forward_options opt;
  opt.mask.causal = causal;
  opt.skip_far_tiles = state.range(3) != 0;
  const alibi::layer_timings t = time_forward(state, layer, L, x, y, opt);
  const double n = static_cast<double>(state.iterations());
  // GEMM flops: q, k, v, out projections (4 x 2 L E^2) and the FFN (2 x 2 L E F).
  const double gemm_flops = 8.0 * L * E * E + 4.0 * L * E * F;
  const double gemm_rate = gemm_flops * n / (t.projections + t.ffn) / 1e9;
  state.counters["gemm_GFLOP/s"] = gemm_rate;
  state.counters["gemm_sgemm_frac"] = gemm_rate / alibi_bench::sgemm_gflops(threads);
  state.counters["attn_GFLOP/s"] =
      alibi_bench::attention_flops(H, L, L, E / H, causal) * n / t.attention / 1e9;
}

/// The family layers at E = 1024, 16 heads: seed 001's (post-norm, GELU, FFN 4096), BLOOM,
/// MPT (GQA 16/4, no biases), Baichuan (RMSNorm, SwiGLU with ff 2752: Baichuan-13B's
/// ff / hidden ratio, 13696 / 5120), Falcon-RW.
alibi::layer_config family_layer(int which) {
  switch (which) {
    case 1:
      return alibi::families::bloom(E, H, 1).layer;
    case 2:
      return alibi::families::mpt(E, H, 1, 4, 4).layer;
    case 3:
      return alibi::families::baichuan(E, H, 2752, 1).layer;
    case 4:
      return alibi::families::falcon_rw(E, H, 1).layer;
    default:
      return seed_layer();
  }
}

// Args: family (0 seed, 1 BLOOM, 2 MPT, 3 Baichuan, 4 Falcon-RW), threads. L = 2048, causal.
void BM_layer_family(benchmark::State& state) {
  const index_t L = 2048;
  const alibi::layer_config c = family_layer(static_cast<int>(state.range(0)));
  auto layer = make_layer(static_cast<int>(state.range(1)), c);
  std::mt19937 rng(2);
  std::vector<float> x(static_cast<std::size_t>(L * E)), y(x.size());
  std::normal_distribution<float> randn;
  for (float& v : x) v = randn(rng);
  alibi::forward_options opt;
  opt.mask.causal = true;
  const alibi::layer_timings t = time_forward(state, layer, L, x, y, opt);
  const auto& a = layer.config().attention;
  const double kv = static_cast<double>(a.kv_heads * a.head_dim);
  const double ffn_mats = c.ffn == alibi::ffn_type::gated ? 3.0 : 2.0;
  const double gemm_flops =
      2.0 * L * E * (2.0 * E + 2.0 * kv) + 2.0 * ffn_mats * L * E * layer.config().ff_dim;
  const double n = static_cast<double>(state.iterations());
  state.counters["gemm_GFLOP/s"] = gemm_flops * n / (t.projections + t.ffn) / 1e9;
}

// One decoding step (`tokens` new tokens, causal) with a cache of N tokens stored as S, far-tile
// skipping on or off: the step is timed, then the cache is truncated back, and the caches
// are emptied of the step's weights and K/V (evict_caches, untimed), as the model's other
// layers would: back to back, steps found part of them in the last-level cache.
template <class S>
void layer_decode(benchmark::State& state, index_t N, int threads, bool skip, index_t tokens = 1) {
  auto layer = make_layer(threads);
  auto cache = alibi::kv_cache<float, alibi::backend::eigen, S>::for_module(layer, 1, N + tokens);
  std::mt19937 rng(3);
  std::normal_distribution<float> randn;
  std::vector<float> prompt(static_cast<std::size_t>(N * E)),
      x(static_cast<std::size_t>(tokens * E)), y(x.size());
  for (float& v : prompt) v = randn(rng);
  for (float& v : x) v = randn(rng);
  alibi::forward_options opt;
  opt.mask.causal = true;
  layer.forward(alibi::make_view<const float>(prompt.data(), 1, N, E),
                alibi::make_view(prompt.data(), 1, N, E), cache, opt);
  opt.skip_far_tiles = skip;
  alibi::layer_timings t;
  opt.timings = &t;
  auto step = [&] {
    layer.forward(alibi::make_view<const float>(x.data(), 1, tokens, E),
                  alibi::make_view(y.data(), 1, tokens, E), cache, opt);
    cache.truncate(0, N);
    benchmark::DoNotOptimize(y.data());
  };
  step();  // untimed, as timed_steps does; then the timings start from zero
  t = {};
  benchmark::DoNotOptimize(alibi_bench::evict_caches(threads));
  for (auto _ : state) {
    step();
    state.PauseTiming();
    benchmark::DoNotOptimize(alibi_bench::evict_caches(threads));
    state.ResumeTiming();
  }
  report(state, t);
  // Bytes a step must read: the weights (4 E^2 + 2 E F floats) and the cached K and V.
  const double bytes = 4.0 * (4.0 * E * E + 2.0 * E * F) + 2.0 * N * E * sizeof(S);
  state.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: tokens in the KV cache, threads, cache type (0 fp32, 1 fp16), far-tile skipping
// (0 off, 1 on).
void BM_layer_decode(benchmark::State& state) {
  const index_t N = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const bool skip = state.range(3) != 0;
  if (state.range(2) == 0)
    layer_decode<float>(state, N, threads, skip);
  else
    layer_decode<Eigen::half>(state, N, threads, skip);
}

// A decoding step of `tokens` tokens at once (speculative decoding's check of drafted tokens),
// fp16 cache, skipping off. Args: tokens in the KV cache, new tokens, threads.
void BM_layer_decode_tokens(benchmark::State& state) {
  layer_decode<Eigen::half>(state, state.range(0), static_cast<int>(state.range(2)), false,
                            state.range(1));
}

// The four attention projections of a decoding step (`rows` tokens, E x E weights each, read
// from memory: the caches are emptied before every step) on `threads` threads, through the
// eigen backend's linear (path 0) or through Eigen's product on linear's GEMM blocks of 512
// columns (path 1, what linear did for every row count before few_rows_products): each call
// is a short parallel call, so what a call's synchronization costs shows beside the bytes
// (16 MiB of weights per step).
void BM_decode_projections(benchmark::State& state) {
  using ops = alibi::detail::layer_ops<alibi::backend::eigen>;
  const index_t rows = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const bool eigen_blocks = state.range(2) != 0;
  const alibi::backend::eigen be{threads};
  std::vector<std::vector<float>> w(4, std::vector<float>(static_cast<std::size_t>(E * E), 0.01f));
  std::vector<float> x(static_cast<std::size_t>(rows * E), 1.0f), y(x.size());
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  auto eigen_linear = [&](const float* wc) {
    constexpr index_t cols = 512;
    alibi::detail::parallel_for(threads, E / cols, [&](index_t item) {
      Eigen::Map<matrix, Eigen::Unaligned, Eigen::OuterStride<>> Y(y.data() + item * cols, rows,
                                                                   cols, Eigen::OuterStride<>(E));
      const Eigen::Map<const matrix> X(x.data(), rows, E);
      const Eigen::Map<const matrix> W(wc + item * cols * E, cols, E);
      Y.noalias() = X * W.transpose();
    });
  };
  auto step = [&] {
    for (const auto& wc : w) {
      if (eigen_blocks)
        eigen_linear(wc.data());
      else
        ops::linear<float>(be, x.data(), E, rows, E, wc.data(), nullptr, E, y.data(), E, false,
                           nullptr);
    }
    benchmark::DoNotOptimize(y.data());
  };
  step();
  for (auto _ : state) {
    state.PauseTiming();
    benchmark::DoNotOptimize(alibi_bench::evict_caches(threads));
    state.ResumeTiming();
    step();
  }
  state.counters["GB/s"] = benchmark::Counter(4.0 * E * E * sizeof(float),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_sgemm_1024(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(alibi_bench::sgemm_gflops(static_cast<int>(state.range(0))));
  state.counters["GFLOP/s"] = alibi_bench::sgemm_gflops(static_cast<int>(state.range(0)));
}

}  // namespace

BENCHMARK(BM_sgemm_1024)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_decode_projections)
    ->ArgsProduct({{1, 2, 4, 16}, {1, 2}, {0, 1}})
    ->ArgNames({"rows", "threads", "eigen_blocks"})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->Iterations(200)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);
BENCHMARK(BM_layer)
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192}, {1, 0}, {2}, {1}})
    ->ArgsProduct({{2048, 8192}, {1, 0}, {2}, {0}})
    ->ArgNames({"L", "causal", "threads", "skip"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

BENCHMARK(BM_layer_family)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {2}})
    ->ArgNames({"family", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1)
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

BENCHMARK(BM_layer_decode)
    ->ArgsProduct({{512, 2048, 8192}, {1, 2}, {0, 1}, {1}})
    ->ArgsProduct({{8192}, {1, 2}, {0, 1}, {0}})
    ->ArgNames({"cache", "threads", "fp16", "skip"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

BENCHMARK(BM_layer_decode_tokens)
    ->ArgsProduct({{2048}, {1, 4}, {1, 2}})
    ->ArgNames({"cache", "tokens", "threads"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Repetitions(3)
    ->ReportAggregatesOnly(true);

BENCHMARK_MAIN();
