// SPDX-License-Identifier: MIT
// The fused CPU backward against the fused forward, the seeds' algorithm differentiated in
// fp32 (materialized scores), and this machine's sgemm, in one run. H = 16.
// Counters: GFLOP/s counting the backward as 5 GEMM-like products (10 * H * Lq * Lk * D,
// 2.5 x the forward's 4 * H * Lq * Lk * D; both halved for causal), and sgemm_frac (that
// rate over the aggregate rate of `threads` concurrent 1024^3 Eigen sgemms, same process).
#include <benchmark/benchmark.h>

#include "common.hpp"

namespace {

using alibi_bench::index_t;
using alibi_bench::row_matrix;

constexpr index_t num_heads = 16;  // (not `heads`: inputs::heads would shadow it)

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

/// Inputs, the forward's output and logsumexp, dout and the gradients.
struct backward_inputs : alibi_bench::inputs {
  std::vector<float> lse, dout, dq, dk, dv;
  alibi::attention_params p;
  backward_inputs(index_t len, index_t d, bool causal)
      : inputs(num_heads, len, len, d),
        lse(static_cast<std::size_t>(heads * len)),
        dout(q.size()),
        dq(q.size()),
        dk(k.size()),
        dv(v.size()) {
    std::mt19937 rng(7);
    std::normal_distribution<float> randn;
    for (float& x : dout) x = randn(rng);
    p.mask.causal = causal;
    p.logsumexp = alibi::make_view(lse.data(), 1, heads, len);
    alibi::attention(alibi::backend::eigen{2}, qv(), kv(), vv(), ov(), p);
  }
  void backward(const alibi::backend::eigen& be, const alibi::attention_params& params) {
    const auto view = [&](std::vector<float>& x) {
      return alibi::make_view(x.data(), 1, heads, len_q, dim);
    };
    alibi::attention_backward(be, qv(), kv(), vv(),
                              alibi::make_view(out.data(), 1, heads, len_q, dim),
                              alibi::make_view(dout.data(), 1, heads, len_q, dim), params,
                              alibi::attention_gradients<float>{view(dq), view(dk), view(dv)});
  }
};

// Args: head_dim, length, causal, threads, skip.
void BM_backward(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  backward_inputs in(len, d, causal);
  alibi::attention_params p = in.p;
  p.skip_far_tiles = state.range(4) != 0;
  alibi::attention_stats stats;
  p.stats = &stats;
  const alibi::backend::eigen be{threads};
  alibi_bench::timed_steps(state, [&] {
    in.backward(be, p);
    benchmark::DoNotOptimize(in.dq.data());
    benchmark::ClobberMemory();
  });
  set_counters(state, 2.5 * alibi_bench::attention_flops(num_heads, len, len, d, causal), threads);
  state.counters["skipped"] =
      static_cast<double>(stats.tiles_skipped) /
      static_cast<double>(std::max<std::int64_t>(1, stats.tiles_skipped + stats.tiles_computed));
}

// Args: head_dim, length, causal, threads, skip. The forward at the same shape, same run.
void BM_forward(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  alibi_bench::inputs in(num_heads, len, len, d);
  alibi::attention_params p;
  p.mask.causal = causal;
  p.skip_far_tiles = state.range(4) != 0;
  const alibi::backend::eigen be{threads};
  alibi_bench::timed_steps(state, [&] {
    alibi::attention(be, in.qv(), in.kv(), in.vv(), in.ov(), p);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  });
  set_counters(state, alibi_bench::attention_flops(num_heads, len, len, d, causal), threads);
}

/// The seeds' algorithm differentiated, in fp32 with Eigen GEMMs: per head, materialize the
/// scores with the bias matrix (built per call), softmax, then dV = P^T dO, dP = dO V^T,
/// dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK = scale dS^T Q. Per-thread L x L score,
/// bias and dP buffers.
void seed_backward(int threads, backward_inputs& in, bool causal) {
  const index_t L = in.len_q, D = in.dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::vector<float> slopes = alibi::slopes(num_heads);
  alibi::detail::parallel_for(threads, num_heads, [&](index_t h) {
    thread_local row_matrix scores, bias, dp;
    scores.resize(L, L);
    bias.resize(L, L);
    dp.resize(L, L);
    const auto off = h * L * D;
    Eigen::Map<const row_matrix> q(in.q.data() + off, L, D), k(in.k.data() + off, L, D),
        v(in.v.data() + off, L, D), dout(in.dout.data() + off, L, D);
    Eigen::Map<row_matrix> dq(in.dq.data() + off, L, D), dk(in.dk.data() + off, L, D),
        dv(in.dv.data() + off, L, D);
    const Eigen::ArrayXf cols = Eigen::ArrayXf::LinSpaced(L, 0.0f, static_cast<float>(L - 1));
    for (index_t i = 0; i < L; ++i)
      bias.row(i) = (-slopes[static_cast<std::size_t>(h)] * (cols - static_cast<float>(i)).abs())
                        .matrix()
                        .transpose();
    scores.noalias() = q * k.transpose();
    scores = scores * scale + bias;
    if (causal)
      for (index_t i = 0; i < L; ++i) scores.row(i).tail(L - i - 1).setConstant(-INFINITY);
    for (index_t i = 0; i < L; ++i) {
      auto r = scores.row(i).array();
      r = (r - r.maxCoeff()).exp();
      r /= r.sum();
    }
    dv.noalias() = scores.transpose() * dout;
    dp.noalias() = dout * v.transpose();
    const Eigen::VectorXf delta = (scores.array() * dp.array()).rowwise().sum();
    dp = (scores.array() * (dp.array().colwise() - delta.array())).matrix() * scale;
    dq.noalias() = dp * k;
    dk.noalias() = dp.transpose() * q;
  });
}

// Args: head_dim, length, causal, threads.
void BM_seed_backward_fp32(benchmark::State& state) {
  const index_t d = state.range(0), len = state.range(1);
  const bool causal = state.range(2) != 0;
  const int threads = static_cast<int>(state.range(3));
  backward_inputs in(len, d, causal);
  alibi_bench::timed_steps(state, [&] {
    seed_backward(threads, in, causal);
    benchmark::DoNotOptimize(in.dq.data());
    benchmark::ClobberMemory();
  });
  set_counters(state, 2.5 * alibi_bench::attention_flops(num_heads, len, len, d, causal), threads);
}

void BM_sgemm_1024(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(alibi_bench::sgemm_gflops(threads));
  state.counters["GFLOP/s"] = alibi_bench::sgemm_gflops(threads);
}

BENCHMARK(BM_sgemm_1024)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_backward)
    ->ArgsProduct({{64, 128}, {2048, 4096, 8192}, {0, 1}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_forward)
    ->ArgsProduct({{64, 128}, {2048, 4096, 8192}, {0, 1}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
// The seeds' three L x L buffers per thread reach 768 MiB per thread at 8192.
BENCHMARK(BM_seed_backward_fp32)
    ->ArgsProduct({{64, 128}, {2048, 4096, 8192}, {0, 1}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
