// SPDX-License-Identifier: MIT
// The layer operations (projections, feed-forward, LayerNorm, copies, and their backward
// passes for training) of the CPU backends, for alibi::multi_head_attention /
// transformer_layer / kv_cache in host memory: GEMMs through Eigen, parallel over fixed
// blocks on the backend's threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "alibi/backend/host/parallel.hpp"
#include "alibi/backend/host/small_rows.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/layer_ops.hpp"

namespace alibi {
namespace detail {

/// Key-norm bounds for a host backend that does not skip far tiles: a kv_cache keeps none.
struct no_key_norms {
  template <class S>
  static constexpr bool keeps = false;
  template <class S>
  static void compute(const tensor_view<const S, 4>&, const tensor_view<float, 3>&, index_t) {}
};

/// The layer operations shared by the host backends (each backend's layers.hpp derives its
/// layer_ops specialization from this), in host memory; the Eigen backend's thread count
/// parallelizes them. KeyNorms says whether, and how, a kv_cache keeps key-norm bounds
/// beside its keys (no_key_norms, or the eigen backend's, which skips far tiles).
template <class Backend, class KeyNorms>
struct host_layer_ops {
  template <class T>
  using buffer = std::vector<T, cpu::aligned_allocator<T>>;

  template <class T>
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  template <class T>
  using const_map = Eigen::Map<const matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
  template <class T>
  using map = Eigen::Map<matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

  // Fixed GEMM blocks: which thread computes a block never changes how it is computed, so
  // results are bitwise independent of the thread count. 256 x 512 output blocks keep the
  // repacking of x and w per block below a few percent of the block's arithmetic.
  static constexpr index_t block_rows = 256, block_cols = 512, norm_rows = 32;

  static int threads(const Backend& be) {
    if constexpr (std::is_same<Backend, backend::eigen>::value)
      return resolve_threads(be.threads);
    else
      return 1;
  }
  template <class T>
  static void upload(const Backend&, const std::vector<T>& host, buffer<T>& dst) {
    dst.assign(host.begin(), host.end());
  }
  template <class T>
  static std::vector<T> download(const Backend&, const buffer<T>& src) {
    return std::vector<T>(src.begin(), src.end());
  }
  /// Whether a kv_cache with storage type S keeps key-norm bounds.
  template <class S>
  static constexpr bool keeps_key_norms = KeyNorms::template keeps<S>;
  /// The key-norm bounds of k's keys from first_key on, for the kv_cache.
  template <class S>
  static void key_norm_bounds(const tensor_view<const S, 4>& k, const tensor_view<float, 3>& bounds,
                              index_t first_key) {
    KeyNorms::compute(k, bounds, first_key);
  }
  template <class T>
  static void resize(buffer<T>& b, index_t n) {
    if (static_cast<index_t>(b.size()) < n) b.resize(static_cast<std::size_t>(n));
  }

  /// Calls f(r0, c0, nr, nc) for every (block_rows x block_cols) block of a (rows, cols)
  /// output on the backend's threads. Each block is one thread's, whole, so what it computes
  /// never depends on the thread count.
  template <class F>
  static void for_each_block(const Backend& be, index_t rows, index_t cols, F&& f) {
    const index_t row_blocks = (rows + block_rows - 1) / block_rows;
    const index_t col_blocks = (cols + block_cols - 1) / block_cols;
    parallel_for(threads(be), row_blocks * col_blocks, [&](index_t item) {
      const index_t r0 = (item / col_blocks) * block_rows, c0 = (item % col_blocks) * block_cols;
      f(r0, c0, std::min(block_rows, rows - r0), std::min(block_cols, cols - c0));
    });
  }

  /// Calls with at most this many rows (a decoding step's tokens, a few speculative tokens, a
  /// small batch) go through cpu::few_rows_products on the eigen backend with fp32, in blocks
  /// of few_rows_cols output columns, rather than Eigen's product: Eigen's GEMM takes a few
  /// rows through its narrowest paths (with AVX-512, fewer rows than a packet holds), and
  /// reads the weights at a fraction of the memory's speed. A row's results are then bitwise
  /// the same whatever the number of rows up to few_rows. Why blocks of 128 columns: a call's
  /// blocks are handed out one at a time, so a helper thread that wakes late still finds some
  /// left (docs/journal/2026-12-design-measurements.md,
  /// "host/layers.hpp: host_layer_ops::few_rows, few_rows_cols").
  static constexpr index_t few_rows = 16, few_rows_cols = 128;

  /// y (rows, out) = act(x (rows, in) w (out, in)^T + bias), or y += x w^T + bias.
  template <class T>
  static void linear(const Backend& be, const T* x, index_t ldx, index_t rows, index_t in,
                     const T* w, const T* bias, index_t out, T* y, index_t ldy, bool accumulate,
                     const activation* act) {
    if (rows == 0 || out == 0) return;
    if constexpr (std::is_same<Backend, backend::eigen>::value && std::is_same<T, float>::value) {
      if (rows <= few_rows && in > 0) {
        parallel_for(threads(be), (out + few_rows_cols - 1) / few_rows_cols, [&](index_t item) {
          const index_t c0 = item * few_rows_cols, nc = std::min(few_rows_cols, out - c0);
          cpu::few_rows_products(x, ldx, rows, w + c0 * in, in, nc, in, y + c0, ldy, accumulate);
          map<T> Y(y + c0, rows, nc, Eigen::OuterStride<>(ldy));  // (rows, nc)
          finish_block(Y, bias, c0, act);
        });
        return;
      }
    }
    for_each_block(be, rows, out, [&](index_t r0, index_t c0, index_t nr, index_t nc) {
      map<T> Y(y + r0 * ldy + c0, nr, nc, Eigen::OuterStride<>(ldy));  // (nr, nc)
      if (in == 0) {
        if (!accumulate) Y.setZero();
      } else {
        const_map<T> X(x + r0 * ldx, nr, in, Eigen::OuterStride<>(ldx));  // (nr, in)
        const_map<T> W(w + c0 * in, nc, in, Eigen::OuterStride<>(in));    // (nc, in)
        if (accumulate)
          Y.noalias() += X * W.transpose();
        else
          Y.noalias() = X * W.transpose();
      }
      finish_block(Y, bias, c0, act);
    });
  }

  /// The end of linear on the block of y whose first column is c0: + bias (its columns'
  /// entries, when there is a bias), then act.
  template <class M>
  static void finish_block(M& y, const typename M::Scalar* bias, index_t c0,
                           const activation* act) {
    using T = typename M::Scalar;
    if (bias != nullptr)
      y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias + c0, y.cols());
    if (act != nullptr) apply(*act, y);
  }

  /// act on every element of y, a row at a time in chunks of 64 copied through an aligned
  /// buffer. Why: on a row of unaligned address Eigen computes the elements before the first
  /// aligned one with its scalar functions, and its scalar exp (std::exp) does not round as
  /// its vectorized one, so a row's values would depend on where the row lies (on its index
  /// in a batch). From the aligned buffer, whether an element goes through the vectorized or
  /// the scalar function depends only on its column.
  template <class M>
  static void apply(activation act, M& y) {
    using T = typename M::Scalar;
    constexpr index_t chunk = 64;
    alignas(64) T buf[chunk];
    for (index_t r = 0; r < y.rows(); ++r)
      for (index_t c0 = 0; c0 < y.cols(); c0 += chunk) {
        const index_t n = std::min(chunk, y.cols() - c0);
        for (index_t c = 0; c < n; ++c) buf[c] = y(r, c0 + c);
        Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>, Eigen::Aligned64> a(buf, n);
        if (act == activation::gelu) {
          // Exact GELU: x * Phi(x) = x/2 (1 + erf(x / sqrt 2)); Eigen's erf is vectorized.
          a = T(0.5) * a * (T(1) + (a * T(0.70710678118654752440)).erf());
        } else if (act == activation::silu) {
          // x sigmoid(x) = x / (1 + exp(-x)): exp(-x) overflows to inf for x < -88 (fp32) and
          // x / inf gives the limit -0, not NaN.
          a = a / (T(1) + (-a).exp());
        } else {
          // tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
          a = T(0.5) * a *
              (T(1) + (T(0.79788456080286535588) * (a + T(0.044715) * a.cube())).tanh());
        }
        for (index_t c = 0; c < n; ++c) y(r, c0 + c) = buf[c];
      }
  }

  /// Sum of f(p[i]) in a fixed order: 16 lane-wise partial sums (vectorizable without
  /// reassociation) combined pairwise. Why not Eigen's sum(): it peels the unaligned head of
  /// a row, so its rounding would depend on the buffer's address (out = x vs not).
  template <class T, class F>
  static T row_sum(const T* p, index_t n, F f) {
    constexpr int lanes = 16;
    T acc[lanes] = {};
    index_t i = 0;
    for (; i + lanes <= n; i += lanes)
      for (int k = 0; k < lanes; ++k) acc[k] += f(p[i + k]);
    for (int k = 0; i < n; ++i, ++k) acc[k] += f(p[i]);
    for (int w = lanes / 2; w > 0; w /= 2)
      for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
    return acc[0];
  }

  /// The mean and 1/sqrt(var + eps) (biased variance) of one row of n features: the one
  /// computation of layer_norm and layer_norm_backward, so that the backward's recomputed
  /// statistics are bitwise the forward's.
  template <class T>
  static std::pair<T, T> row_moments(const T* in, index_t n, float eps) {
    const T mean = row_sum(in, n, [](T v) { return v; }) / T(n);
    const T var = row_sum(in, n, [mean](T v) { return (v - mean) * (v - mean); }) / T(n);
    return {mean, T(1) / std::sqrt(var + T(eps))};
  }

  /// The statistics of a row for either norm: LayerNorm's row_moments, or RMSNorm's
  /// {0, 1/sqrt(mean(x^2) + eps)} (rms_norm and the backward share this one computation).
  template <class T>
  static std::pair<T, T> row_stats(norm_type kind, const T* in, index_t n, float eps) {
    if (kind == norm_type::layer_norm) return row_moments(in, n, eps);
    return {T(0), T(1) / std::sqrt(row_sum(in, n, [](T v) { return v * v; }) / T(n) + T(eps))};
  }

  /// y = (x - mean) / sqrt(var + eps) * gamma + beta per row of n features (biased variance,
  /// as nn.LayerNorm; beta may be null: none). Two passes over the row: the variance of
  /// x - mean does not cancel.
  template <class T>
  static void layer_norm(const Backend& be, const T* x, index_t ldx, T* y, index_t ldy,
                         index_t rows, index_t n, const T* gamma, const T* beta, float eps) {
    if (n == 0) return;
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const T* in = x + r * ldx;
        const auto [mean, inv] = row_moments(in, n, eps);
        T* o = y + r * ldy;
        if (beta != nullptr)
          for (index_t i = 0; i < n; ++i) o[i] = (in[i] - mean) * inv * gamma[i] + beta[i];
        else
          for (index_t i = 0; i < n; ++i) o[i] = (in[i] - mean) * inv * gamma[i];
      }
    });
  }

  /// y = x / sqrt(mean(x^2) + eps) * gamma per row of n features (RMSNorm). y may be x.
  template <class T>
  static void rms_norm(const Backend& be, const T* x, index_t ldx, T* y, index_t ldy, index_t rows,
                       index_t n, const T* gamma, float eps) {
    if (n == 0) return;
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const T* in = x + r * ldx;
        const T inv = row_stats(norm_type::rms_norm, in, n, eps).second;
        T* o = y + r * ldy;
        for (index_t i = 0; i < n; ++i) o[i] = in[i] * inv * gamma[i];
      }
    });
  }

  /// a (rows, cols) *= b element-wise (the gated feed-forward network's product).
  template <class T>
  static void multiply(const Backend& be, T* a, index_t lda, const T* b, index_t ldb, index_t rows,
                       index_t cols) {
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r)
        for (index_t c = 0; c < cols; ++c) a[r * lda + c] *= b[r * ldb + c];
    });
  }

  // ---- Training: the backward operations (CPU only; see docs/layers-and-models.md, "Training").
  // Every reduction has one fixed order whatever the thread count: threads own disjoint
  // output blocks (rows of dW, columns of db and of the LayerNorm parameter gradients), and a
  // sum over rows is never split between threads.

  /// The CPU backends have the layers' backward pass (detail::has_layer_backward).
  static constexpr bool layer_backward = true;

  /// dx (rows, in) = dy (rows, out) w (out, in), or dx += when accumulate: the input gradient
  /// of y = x w^T + b. Fixed (block_rows x block_cols) blocks of dx, as in linear().
  template <class T>
  static void linear_backward_input(const Backend& be, const T* dy, index_t lddy, index_t rows,
                                    index_t out, const T* w, index_t in, T* dx, index_t lddx,
                                    bool accumulate) {
    if (rows == 0 || in == 0) return;
    for_each_block(be, rows, in, [&](index_t r0, index_t c0, index_t nr, index_t nc) {
      map<T> DX(dx + r0 * lddx + c0, nr, nc, Eigen::OuterStride<>(lddx));  // (nr, nc)
      if (out == 0) {
        if (!accumulate) DX.setZero();
        return;
      }
      const_map<T> DY(dy + r0 * lddy, nr, out, Eigen::OuterStride<>(lddy));  // (nr, out)
      const_map<T> W(w + c0, out, nc, Eigen::OuterStride<>(in));             // (out, nc)
      if (accumulate)
        DX.noalias() += DY * W;
      else
        DX.noalias() = DY * W;
    });
  }

  /// The parameter gradients of y = x w^T + b: dw (out, in) = dy^T (out, rows) x (rows, in)
  /// and, when db is not null, db (out) = the column sums of dy. Both overwrite.
  /// Why blocks of dw's rows and columns, each one GEMM over all rows: the reduction over
  /// rows (batch x sequence) stays inside one Eigen product whose blocking depends only on
  /// the shapes, so no thread ever adds a partial sum of another (bitwise independence).
  template <class T>
  static void linear_backward_params(const Backend& be, const T* dy, index_t lddy, index_t rows,
                                     index_t out, const T* x, index_t ldx, index_t in, T* dw,
                                     T* db) {
    if (out == 0) return;
    for_each_block(be, out, in, [&](index_t r0, index_t c0, index_t nr, index_t nc) {
      map<T> DW(dw + r0 * in + c0, nr, nc, Eigen::OuterStride<>(in));  // (nr, nc)
      if (rows == 0) {
        DW.setZero();
        return;
      }
      const_map<T> DY(dy + r0, rows, nr, Eigen::OuterStride<>(lddy));  // (rows, nr)
      const_map<T> X(x + c0, rows, nc, Eigen::OuterStride<>(ldx));     // (rows, nc)
      DW.noalias() = DY.transpose() * X;
    });
    if (db != nullptr)
      column_sums(be, rows, out, db, [&](index_t r, index_t c) { return dy[r * lddy + c]; });
  }

  /// sum[c] = sum over r in [0, rows) of f(r, c), rows in increasing order, for c in
  /// [0, cols): threads own blocks of columns (the order of each sum never changes).
  template <class T, class F>
  static void column_sums(const Backend& be, index_t rows, index_t cols, T* sum, F f) {
    constexpr index_t cols_per_block = 64;
    const index_t blocks = (cols + cols_per_block - 1) / cols_per_block;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      const index_t c0 = blk * cols_per_block, c1 = std::min(cols, c0 + cols_per_block);
      for (index_t c = c0; c < c1; ++c) sum[c] = T(0);
      for (index_t r = 0; r < rows; ++r)
        for (index_t c = c0; c < c1; ++c) sum[c] += f(r, c);
    });
  }

  /// y (rows, cols) = act(x) element-wise (the training forward keeps x, the pre-activation).
  template <class T>
  static void activation_forward(const Backend& be, const T* x, index_t ldx, T* y, index_t ldy,
                                 index_t rows, index_t cols, activation act) {
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      const index_t r0 = blk * norm_rows, nr = std::min(norm_rows, rows - r0);
      copy_rows(be, x + r0 * ldx, ldx, y + r0 * ldy, ldy, nr, cols);
      map<T> Y(y + r0 * ldy, nr, cols, Eigen::OuterStride<>(ldy));  // (nr, cols)
      apply(act, Y);
    });
  }

  /// dh (rows, cols) *= act'(x), x the pre-activation: the gradient through the activation.
  /// exact: d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi).
  /// silu:  with s = sigmoid(x), d/dx [x s] = s (1 + x (1 - s)).
  /// tanh:  with u = c (x + a x^3), t = tanh(u), c = sqrt(2/pi), a = 0.044715:
  ///        d/dx [x/2 (1 + t)] = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2).
  template <class T>
  static void activation_backward(const Backend& be, const T* x, index_t ldx, T* dh, index_t ldh,
                                  index_t rows, index_t cols, activation act) {
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const T* in = x + r * ldx;
        T* g = dh + r * ldh;
        for (index_t i = 0; i < cols; ++i) {
          const T v = in[i];
          T d;
          if (act == activation::gelu) {
            const T cdf = T(0.5) * (T(1) + std::erf(v * T(0.70710678118654752440)));
            d = cdf + v * T(0.39894228040143267794) * std::exp(T(-0.5) * v * v);
          } else if (act == activation::silu) {
            const T sig = T(1) / (T(1) + std::exp(-v));
            d = sig * (T(1) + v * (T(1) - sig));
          } else {
            const T c = T(0.79788456080286535588), a = T(0.044715);
            const T t = std::tanh(c * (v + a * v * v * v));
            // Where tanh has saturated (1 - t^2 == 0), the second term is 0 whatever
            // 3 a v^2 is: for |v| > 1e19 it overflows, and 0 x inf would be NaN.
            const T sech2 = T(1) - t * t;
            d = T(0.5) * (T(1) + t) +
                (sech2 == T(0) ? T(0) : T(0.5) * v * sech2 * c * (T(1) + T(3) * a * v * v));
          }
          g[i] *= d;
        }
      }
    });
  }

  /// The backward pass of layer_norm(x) = (x - mean) rstd gamma + beta per row of n
  /// features, or of rms_norm(x) = x rstd gamma (kind). With xh = (x - mean) rstd and
  /// g = dy gamma:
  ///   dx = rstd (g - mean(g) - xh mean(g xh))    (written, or added when accumulate)
  ///   dgamma = sum over rows of dy xh,  dbeta = sum over rows of dy   (overwritten)
  /// RMSNorm has mean = 0 and no mean(g) term (no centering), and no beta (dbeta null).
  /// mean and rstd are recomputed from x exactly as the forward computes them (so nothing
  /// but the normalized input has to be kept). dx may be dy.
  template <class T>
  static void layer_norm_backward(const Backend& be, norm_type kind, const T* x, index_t ldx,
                                  const T* dy, index_t lddy, index_t rows, index_t n,
                                  const T* gamma, float eps, T* dx, index_t lddx, bool accumulate,
                                  T* dgamma, T* dbeta) {
    if (n == 0) return;
    std::vector<T> stats(static_cast<std::size_t>(2 * rows));  // (rows, [mean, rstd])
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const auto [mean, inv] = row_stats(kind, x + r * ldx, n, eps);
        stats[static_cast<std::size_t>(2 * r)] = mean;
        stats[static_cast<std::size_t>(2 * r + 1)] = inv;
      }
    });
    // The parameter sums first: they read dy, which dx may overwrite.
    if (dgamma != nullptr)
      column_sums(be, rows, n, dgamma, [&](index_t r, index_t c) {
        const T mean = stats[static_cast<std::size_t>(2 * r)];
        const T inv = stats[static_cast<std::size_t>(2 * r + 1)];
        return dy[r * lddy + c] * ((x[r * ldx + c] - mean) * inv);
      });
    if (dbeta != nullptr)
      column_sums(be, rows, n, dbeta, [&](index_t r, index_t c) { return dy[r * lddy + c]; });
    parallel_for(threads(be), blocks, [&](index_t blk) {
      std::vector<T> g(static_cast<std::size_t>(n)), gx(static_cast<std::size_t>(n));  // (n)
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const T* in = x + r * ldx;
        const T* d = dy + r * lddy;
        const T mean = stats[static_cast<std::size_t>(2 * r)];
        const T inv = stats[static_cast<std::size_t>(2 * r + 1)];
        for (index_t i = 0; i < n; ++i) {
          const std::size_t k = static_cast<std::size_t>(i);
          g[k] = d[i] * gamma[i];
          gx[k] = g[k] * ((in[i] - mean) * inv);
        }
        const T mg = kind == norm_type::layer_norm
                         ? row_sum(g.data(), n, [](T v) { return v; }) / T(n)
                         : T(0);
        const T mgx = row_sum(gx.data(), n, [](T v) { return v; }) / T(n);
        T* o = dx + r * lddx;
        for (index_t i = 0; i < n; ++i) {
          const std::size_t k = static_cast<std::size_t>(i);
          const T v = inv * (g[k] - mg - (in[i] - mean) * inv * mgx);
          o[i] = accumulate ? o[i] + v : v;
        }
      }
    });
  }

  /// Rows converted to another element type (appending to a half-precision KV cache):
  /// rounded to nearest.
  template <class T, class S, class = std::enable_if_t<!std::is_same<T, S>::value>>
  static void copy_rows(const Backend&, const T* src, index_t lds, S* dst, index_t ldd,
                        index_t rows, index_t cols) {
    for (index_t r = 0; r < rows; ++r)
      for (index_t c = 0; c < cols; ++c) dst[r * ldd + c] = static_cast<S>(src[r * lds + c]);
  }
  template <class T>
  static void copy_rows(const Backend&, const T* src, index_t lds, T* dst, index_t ldd,
                        index_t rows, index_t cols) {
    if (src == dst && lds == ldd) return;
    for (index_t r = 0; r < rows; ++r)
      std::memmove(dst + r * ldd, src + r * lds, static_cast<std::size_t>(cols) * sizeof(T));
  }
  template <class T>
  static void zero_rows(const Backend&, T* dst, index_t ld, index_t rows, index_t cols) {
    for (index_t r = 0; r < rows; ++r) std::fill(dst + r * ld, dst + r * ld + cols, T(0));
  }
  static tensor_view<const index_t, 1> per_batch(const Backend&, const std::vector<index_t>& host,
                                                 buffer<index_t>&) {
    return make_view(host.data(), static_cast<index_t>(host.size()));
  }
  static tensor_view<const bool, 2> key_mask(const Backend&, tensor_view<const bool, 2> host,
                                             buffer<bool>&) {
    return host;
  }
  static void fence(const Backend&) {}
};

}  // namespace detail
}  // namespace alibi
