// SPDX-License-Identifier: MIT
// The layer operations (projections, feed-forward, LayerNorm, copies) of the CPU backends,
// for alibi::multi_head_attention / transformer_layer / kv_cache in host memory: GEMMs
// through Eigen, parallel over fixed blocks on the backend's threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/SpecialFunctions>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/parallel.hpp"
#include "alibi/backend/reference/attention.hpp"
#include "alibi/layers/ops.hpp"

namespace alibi {
namespace detail {

/// The CPU backends' layer operations, in host memory; the Eigen backend's thread count
/// parallelizes them.
template <class Backend>
struct layer_ops<Backend, std::enable_if_t<std::is_same<Backend, backend::eigen>::value ||
                                           std::is_same<Backend, backend::reference>::value>> {
  template <class T>
  using buffer = std::vector<T>;

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
    dst = host;
  }
  template <class T>
  static std::vector<T> download(const Backend&, const buffer<T>& src) {
    return src;
  }
  template <class T>
  static void resize(buffer<T>& b, index_t n) {
    if (static_cast<index_t>(b.size()) < n) b.resize(static_cast<std::size_t>(n));
  }

  /// y (rows, out) = act(x (rows, in) w (out, in)^T + bias), or y += x w^T + bias.
  template <class T>
  static void linear(const Backend& be, const T* x, index_t ldx, index_t rows, index_t in,
                     const T* w, const T* bias, index_t out, T* y, index_t ldy, bool accumulate,
                     const activation* act) {
    if (rows == 0 || out == 0) return;
    const index_t row_blocks = (rows + block_rows - 1) / block_rows;
    const index_t col_blocks = (out + block_cols - 1) / block_cols;
    parallel_for(threads(be), row_blocks * col_blocks, [&](index_t item) {
      const index_t r0 = (item / col_blocks) * block_rows, c0 = (item % col_blocks) * block_cols;
      const index_t nr = std::min(block_rows, rows - r0), nc = std::min(block_cols, out - c0);
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
      if (bias != nullptr)
        Y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias + c0, nc);
      if (act != nullptr) apply(*act, Y);
    });
  }

  template <class M>
  static void apply(activation act, M& y) {
    using T = typename M::Scalar;
    for (index_t r = 0; r < y.rows(); ++r) {
      auto a = y.row(r).array();
      if (act == activation::gelu) {
        // Exact GELU: x * Phi(x) = x/2 (1 + erf(x / sqrt 2)); Eigen's erf is vectorized.
        a = T(0.5) * a * (T(1) + (a * T(0.70710678118654752440)).erf());
      } else {
        // tanh approximation: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
        a = T(0.5) * a * (T(1) + (T(0.79788456080286535588) * (a + T(0.044715) * a.cube())).tanh());
      }
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

  /// y = (x - mean) / sqrt(var + eps) * gamma + beta per row of n features (biased variance,
  /// as nn.LayerNorm). Two passes over the row: the variance of x - mean does not cancel.
  template <class T>
  static void layer_norm(const Backend& be, const T* x, index_t ldx, T* y, index_t ldy,
                         index_t rows, index_t n, const T* gamma, const T* beta, float eps) {
    if (n == 0) return;
    const index_t blocks = (rows + norm_rows - 1) / norm_rows;
    parallel_for(threads(be), blocks, [&](index_t blk) {
      for (index_t r = blk * norm_rows; r < std::min(rows, (blk + 1) * norm_rows); ++r) {
        const T* in = x + r * ldx;
        const T mean = row_sum(in, n, [](T v) { return v; }) / T(n);
        const T var = row_sum(in, n, [mean](T v) { return (v - mean) * (v - mean); }) / T(n);
        const T inv = T(1) / std::sqrt(var + T(eps));
        T* o = y + r * ldy;
        for (index_t i = 0; i < n; ++i) o[i] = (in[i] - mean) * inv * gamma[i] + beta[i];
      }
    });
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
