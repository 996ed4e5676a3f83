// SPDX-License-Identifier: MIT
// Shared pieces of the CPU benchmarks: inputs, the fp32 seed algorithm (the baseline), and
// this machine's sgemm throughput measured in the same process.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <alibi/alibi.hpp>
#include <alibi/backend/eigen/attention_backward.hpp>

namespace alibi_bench {

using alibi::index_t;
using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Calls step() once untimed, then reset() (which clears what the untimed call must not add
/// to, such as accumulated timings), then step() once per iteration of `state`. Why the
/// untimed call: on this project's virtual machines the first pass over freshly written
/// buffers can take many times as long as the next ones (a plain loop over 512 MiB converted
/// from a freed float buffer: 230-670 ms, then 21-23 ms), and Google Benchmark 1.7 reports a
/// single iteration alone when it exceeds the minimum time, so that first pass would be the
/// figure. (State is benchmark::State; a template so that this header, also used by
/// alibi_peak_memory, needs no Google Benchmark.)
template <class State, class Step, class Reset>
void timed_steps(State& state, Step&& step, Reset&& reset) {
  step();
  reset();
  for (auto _ : state) step();
}

template <class State, class Step>
void timed_steps(State& state, Step&& step) {
  timed_steps(state, std::forward<Step>(step), [] {});
}

/// Reads 256 MiB that nothing else uses, more than the last-level cache holds, so that the
/// next step finds none of its data in cache: a decoding step of one layer follows the other
/// layers' steps, which leave none of its weights and K/V there. The read is split over
/// `threads` threads of alibi's pool, as the other layers' work would be: a pool left idle
/// while one thread reads sends its workers to sleep, and waking them delays the next step's
/// first parallel call (measured on this project's KVM guest: the projections of a layer's
/// decoding step took longer on two threads than on one). Returns a sum of what it read (for
/// benchmark::DoNotOptimize).
inline float evict_caches(int threads) {
  static const std::vector<float> buf(std::size_t(64) << 20, 1.0f);
  const auto n = static_cast<index_t>(buf.size());
  std::vector<float> partial(static_cast<std::size_t>(threads));
  alibi::detail::parallel_for(threads, threads, [&](index_t t) {
    const index_t chunk = n / threads;
    float acc[16] = {};
    for (index_t i = t * chunk; i + 16 <= (t + 1) * chunk; i += 16)
      for (int u = 0; u < 16; ++u) acc[u] += buf[static_cast<std::size_t>(i + u)];
    for (float a : acc) partial[static_cast<std::size_t>(t)] += a;
  });
  float sum = 0;
  for (float p : partial) sum += p;
  return sum;
}

/// q, k, v of shape (1, heads, len, dim), randn with a fixed seed.
struct inputs {
  index_t heads, len_q, len_k, dim;
  std::vector<float> q, k, v, out;
  inputs(index_t h, index_t lq, index_t lk, index_t d, unsigned seed = 42)
      : heads(h),
        len_q(lq),
        len_k(lk),
        dim(d),
        q(static_cast<std::size_t>(h * lq * d)),
        k(static_cast<std::size_t>(h * lk * d)),
        v(k.size()),
        out(q.size()) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> randn;
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = randn(rng);
  }
  alibi::tensor_view<const float, 4> qv() const {
    return alibi::make_view(q.data(), 1, heads, len_q, dim);
  }
  alibi::tensor_view<const float, 4> kv() const {
    return alibi::make_view(k.data(), 1, heads, len_k, dim);
  }
  alibi::tensor_view<const float, 4> vv() const {
    return alibi::make_view(v.data(), 1, heads, len_k, dim);
  }
  alibi::tensor_view<float, 4> ov() { return alibi::make_view(out.data(), 1, heads, len_q, dim); }
};

/// Attention flops as usually counted: two GEMMs of 2 * Lq * Lk * D each, halved for causal.
inline double attention_flops(index_t heads, index_t lq, index_t lk, index_t d, bool causal) {
  return 4.0 * static_cast<double>(heads) * lq * lk * d * (causal ? 0.5 : 1.0);
}

/// The seeds' algorithm in fp32 with Eigen: per head, materialize scale * Q K^T (GEMM), add
/// the ALiBi bias matrix (built per call, as the seeds do), mask, softmax, multiply by V.
/// Per-thread score and bias buffers of L x L floats.
inline void seed_attention(int threads, inputs& in, bool causal) {
  const index_t L = in.len_q, Lk = in.len_k, D = in.dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::vector<float> slopes = alibi::slopes(in.heads);
  alibi::detail::parallel_for(threads, in.heads, [&](index_t h) {
    thread_local row_matrix scores, bias;
    scores.resize(L, Lk);
    bias.resize(L, Lk);
    Eigen::Map<const row_matrix> q(in.q.data() + h * L * D, L, D),
        k(in.k.data() + h * Lk * D, Lk, D), v(in.v.data() + h * Lk * D, Lk, D);
    Eigen::Map<row_matrix> o(in.out.data() + h * L * D, L, D);
    const Eigen::ArrayXf cols = Eigen::ArrayXf::LinSpaced(Lk, 0.0f, static_cast<float>(Lk - 1));
    for (index_t i = 0; i < L; ++i)
      bias.row(i) =
          (-slopes[static_cast<std::size_t>(h)] * (cols - static_cast<float>(i + Lk - L)).abs())
              .matrix()
              .transpose();
    scores.noalias() = q * k.transpose();
    scores = scores * scale + bias;
    if (causal)
      for (index_t i = 0; i < L; ++i)
        scores.row(i).tail(std::max<index_t>(0, Lk - (i + Lk - L) - 1)).setConstant(-INFINITY);
    for (index_t i = 0; i < L; ++i) {
      auto r = scores.row(i).array();
      r = (r - r.maxCoeff()).exp();
      r /= r.sum();
    }
    o.noalias() = scores * v;
  });
}

/// Where the FMA loops store their results, so that they are not optimized away.
inline volatile float fma_sink = 0.0f;

/// Aggregate GFLOP/s of `threads` concurrent register-only FMA loops at the widest vector
/// width this file was compiled for: the core's arithmetic ceiling, against which the
/// kernels' rates are reported. 16 independent accumulators hide the FMA latency on every
/// core of the last decade (latency 4 x 2 ports = 8 in flight). Median of 7 repetitions,
/// measured once per process.
inline double fma_peak_gflops(int threads) {
  using packet = Eigen::internal::packet_traits<float>::type;
  constexpr int lanes = Eigen::internal::packet_traits<float>::size;
  constexpr int accs = 16;
  constexpr long iters = 1L << 24;
  static double cached[64] = {};
  if (cached[threads] > 0) return cached[threads];
  std::vector<double> rates;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        namespace ei = Eigen::internal;
        // Multiplier and addend just below and above 1 keep the values finite and normal.
        const packet a = ei::pset1<packet>(0.999999f), b = ei::pset1<packet>(1e-7f);
        packet acc[accs];
        for (int i = 0; i < accs; ++i) acc[i] = ei::pset1<packet>(static_cast<float>(i + t));
        for (long it = 0; it < iters; ++it)
          for (int i = 0; i < accs; ++i) acc[i] = ei::pmadd(acc[i], a, b);
        float total = 0.0f;
        for (int i = 0; i < accs; ++i) total += ei::predux(acc[i]);
        fma_sink = total;
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * lanes * accs * static_cast<double>(iters) * threads / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return cached[threads] = rates[rates.size() / 2];
}

/// Aggregate GFLOP/s of `threads` concurrent 1024^3 Eigen sgemms: the practical limit of this
/// machine for GEMM-bound work. Median of 7 repetitions, measured once per process.
inline double sgemm_gflops(int threads) {
  static double cached[64] = {};
  if (cached[threads] > 0) return cached[threads];
  const index_t n = 1024;
  std::vector<double> rates;
  std::vector<Eigen::MatrixXf> a(static_cast<std::size_t>(threads), Eigen::MatrixXf::Random(n, n)),
      b(a), c(a);
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        c[static_cast<std::size_t>(t)].noalias() =
            a[static_cast<std::size_t>(t)] * b[static_cast<std::size_t>(t)];
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(2.0 * n * n * n * threads / s / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return cached[threads] = rates[rates.size() / 2];
}

}  // namespace alibi_bench
