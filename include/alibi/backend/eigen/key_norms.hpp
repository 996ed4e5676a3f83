// SPDX-License-Identifier: MIT
// alibi::key_norm_bounds: the key-norm bounds of far-tile skipping computed once, for a
// caller (or the layers' kv_cache) that keeps them beside its K and passes them to each
// call (attention_params::key_norm_bounds), so that a decode step with skipping reads only
// the K/V tiles it computes.
#pragma once

#include <algorithm>
#include <string>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/kv_tiles.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// Upper bounds on the Euclidean norms of the keys of k (batch, kv_heads, k_len, head_dim;
/// float, Eigen::half or Eigen::bfloat16 in host memory), one per block of key_norm_block
/// keys, into bounds (batch, kv_heads, ceil(k_len / key_norm_block)): what
/// attention_params::key_norm_bounds takes. Only the blocks from the one holding first_key
/// on are computed (each from all of its keys below k_len); the others are left as they
/// are, so a cache that appends keys at position n refreshes its bounds with first_key = n.
/// The norms are summed in float and rounded up as the CPU kernel does; a NaN key gives NaN.
template <class T>
void key_norm_bounds(const tensor_view<const T, 4>& k, const tensor_view<float, 3>& bounds,
                     index_t first_key = 0) {
  static_assert(detail::cpu::is_cpu_kv_type<T>,
                "alibi::key_norm_bounds: k must be float, Eigen::half or Eigen::bfloat16");
  detail::check_key_norm_bounds_args("alibi::key_norm_bounds", k, bounds, first_key);
  const index_t B = k.extents[0], H = k.extents[1], L = k.extents[2];
  const index_t blocks = (L + key_norm_block - 1) / key_norm_block;
  if (B == 0 || H == 0 || L == 0) return;
  if (k.data == nullptr || bounds.data == nullptr)
    detail::raise(
        argument_error("alibi::key_norm_bounds: k.data and bounds.data must not be null"));
  const detail::cpu::kv_source<T> src{k, k};
  auto block = [&](index_t b, index_t h, index_t t) {
    bounds(b, h, t) =
        src.norm_bound(b, h, t * key_norm_block, std::min(L, (t + 1) * key_norm_block),
                       [](index_t) { return false; });
  };
  // With the tokens outermost, a block at a time for every head, so that the reads stay
  // within one block's token rows (the same values in another order).
  const index_t t0 = first_key / key_norm_block;
  for (index_t b = 0; b < B; ++b) {
    if (src.keys_interleave()) {
      for (index_t t = t0; t < blocks; ++t)
        for (index_t h = 0; h < H; ++h) block(b, h, t);
    } else {
      for (index_t h = 0; h < H; ++h)
        for (index_t t = t0; t < blocks; ++t) block(b, h, t);
    }
  }
}

namespace detail {

/// alibi::key_norm_bounds for the storage types the eigen kernel reads: how a kv_cache on the
/// eigen backend keeps key-norm bounds beside its keys (host_layer_ops' KeyNorms).
struct eigen_key_norms {
  template <class S>
  static constexpr bool keeps = cpu::is_cpu_kv_type<S>;
  template <class S>
  static void compute(const tensor_view<const S, 4>& k, const tensor_view<float, 3>& bounds,
                      index_t first_key) {
    alibi::key_norm_bounds(k, bounds, first_key);
  }
};

}  // namespace detail

}  // namespace alibi
