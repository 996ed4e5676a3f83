// SPDX-License-Identifier: MIT
// The attention contract as data: the parameters of a call (attention_params) and the
// resolved problem every backend reads (detail::attention_problem), with the per-(batch,
// head, row) answers of the contract (lengths, positions, slopes, key ranges). No
// third-party header; usable from host and device code.
#pragma once

#include <optional>

#include "alibi/core/bias.hpp"
#include "alibi/core/config.hpp"
#include "alibi/core/slopes.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// Keys per block of attention_params::key_norm_bounds (the CPU kernel's key tile).
inline constexpr index_t key_norm_block = 128;

/// Counters of the work a fused backend did in one call (optional output).
struct attention_stats {
  std::int64_t tiles_computed = 0;  // key tiles whose scores were computed
  std::int64_t tiles_skipped = 0;   // key tiles skipped by the far-tile bound
};

/// Everything about an attention call except the four tensors. Tensors are viewed as
/// q (batch, q_heads, q_len, head_dim), k (batch, kv_heads, k_len, head_dim),
/// v (batch, kv_heads, k_len, v_head_dim), out (batch, q_heads, q_len, v_head_dim), with
/// any strides except that the last dimension is contiguous. view_bshd() makes such a view
/// over (batch, seq, heads, dim) memory.
///
/// The optional per-batch views live where the backend reads them: host memory for the
/// CPU backends, device memory for the CUDA backend.
struct attention_params {
  /// Multiplies q.k; default 1/sqrt(head_dim). The ALiBi bias is added after scaling.
  std::optional<float> scale{};
  /// Causal and sliding-window masks, relative to positions.
  mask_spec mask{};
  /// Where the slopes come from (default: generated, max_bias 8).
  slope_config slopes{};
  /// (batch) valid query rows per batch entry; rows >= q_lengths(b) produce zeros.
  tensor_view<const index_t, 1> q_lengths{};
  /// (batch) valid keys per batch entry; keys >= k_lengths(b) are excluded and never read.
  tensor_view<const index_t, 1> k_lengths{};
  /// (batch) position of query row 0; default k_lengths(b) - q_lengths(b) (bottom-right).
  tensor_view<const index_t, 1> q_offsets{};
  /// (batch) position of key 0; default 0.
  tensor_view<const index_t, 1> k_offsets{};
  /// (batch, k_len) true = key excluded (padding, holes in packed sequences).
  tensor_view<const bool, 2> key_mask{};
  /// Optional output (batch, q_heads, q_len): natural-log logsumexp of each row's scores
  /// over its unmasked keys; -inf for fully masked rows and padded query rows.
  tensor_view<float, 3> logsumexp{};
  /// Skip key tiles that ALiBi makes negligible: a tile is skipped only when a bound on the
  /// total softmax weight of it and every farther tile is below 2^-25 of the row's running
  /// normalizer, so the skipped tiles' contribution is below 2^-24 max|v|; on and off also sum
  /// the kept tiles in different orders, so the two outputs differ by that plus fp32
  /// reordering (docs/far-tile-skipping.md). false computes every tile.
  bool skip_far_tiles = true;
  /// Optional: counters of the tiles computed and skipped (fused CPU and CUDA backends; the
  /// CUDA backend waits for the call's stream to finish to fill them). Far-tile skipping is
  /// opt-in on the CUDA backend: see backend::cuda.
  attention_stats* stats = nullptr;
  /// Optional, for far-tile skipping on the eigen and CUDA backends (host memory for the one,
  /// device memory for the other; the reference backend ignores it):
  /// (batch, kv_heads, ceil(k_len / key_norm_block)) upper bounds on the Euclidean norm of
  /// the keys of each block of key_norm_block keys (keys no row can see may be left out, or
  /// counted). Without it the call computes them from K, a pass over all of K: for a decode
  /// step, half as many bytes again as it reads otherwise. alibi::key_norm_bounds() computes
  /// them (also for the blocks from a given key on, for a cache that grows; for device K,
  /// alibi::key_norm_bounds(backend::cuda, ...)), and the layers' kv_cache on the eigen
  /// backend keeps them. A value below a true norm voids the skipping's error bound; NaN
  /// disables skipping for its KV head.
  tensor_view<const float, 3> key_norm_bounds{};
};

namespace detail {

/// The resolved problem: sizes, defaults applied, and the per-(batch, head, row) questions
/// every backend asks, answered by one piece of code. Trivially copyable (a kernel argument).
/// Whether far-tile skipping applies to a call: asked for, ALiBi on (without a bias no tile is
/// far), and more than one key tile (a lone tile holds every key a row can keep). The one
/// predicate behind the CPU forward and backward, the CUDA kernels and MPI's far chunks.
ALIBI_HOST_DEVICE constexpr bool far_tile_skipping_applies(bool requested, bool slopes_enabled,
                                                           index_t key_tiles) {
  return requested && slopes_enabled && key_tiles > 1;
}

struct attention_problem {
  index_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, k_len = 0, head_dim = 0, v_head_dim = 0;
  float scale = 1.0f;
  mask_spec mask{};
  slope_config slopes{};
  tensor_view<const index_t, 1> q_lengths{}, k_lengths{}, q_offsets{}, k_offsets{};
  tensor_view<const bool, 2> key_mask{};
  tensor_view<float, 3> lse{};
  /// Internal (the eigen backward's recomputation): lse receives each row's base-2
  /// logsumexp in the kernels' shifted frame (see distance_shift), not the contract's.
  bool lse_shifted_base2 = false;
  bool skip_far_tiles = true;
  attention_stats* stats = nullptr;
  tensor_view<const float, 3> key_norm_bounds{};

  /// far_tile_skipping_applies for this problem cut into key_tiles tiles of keys.
  ALIBI_HOST_DEVICE constexpr bool skips_far_tiles(index_t key_tiles) const {
    return far_tile_skipping_applies(skip_far_tiles, slopes.enabled, key_tiles);
  }

  /// Valid query rows / keys of batch entry b, clamped to [0, q_len] / [0, k_len]. Why:
  /// on the host make_problem refuses out-of-range lengths (it checks the raw values), but
  /// device-side lengths cannot be read by the host check; clamping here keeps a bad value
  /// from making a kernel read past the ends of K and V or write past out (two compares,
  /// no effect on valid values).
  ALIBI_HOST_DEVICE index_t len_q(index_t b) const {
    return q_lengths.data ? clamp_length(q_lengths(b), q_len) : q_len;
  }
  ALIBI_HOST_DEVICE index_t len_k(index_t b) const {
    return k_lengths.data ? clamp_length(k_lengths(b), k_len) : k_len;
  }
  ALIBI_HOST_DEVICE index_t q_offset(index_t b) const {
    return q_offsets.data ? q_offsets(b) : len_k(b) - len_q(b);
  }
  ALIBI_HOST_DEVICE index_t k_offset(index_t b) const { return k_offsets.data ? k_offsets(b) : 0; }
  /// Query heads per kv head (GQA). At least 1, so that kv_head never divides by zero:
  /// problems without heads (q_heads = 0, with or without kv heads) are empty and never ask
  /// for a kv head, but a backend may still compute sizes from the group size.
  ALIBI_HOST_DEVICE index_t group_size() const {
    return kv_heads > 0 && q_heads >= kv_heads ? q_heads / kv_heads : 1;
  }
  ALIBI_HOST_DEVICE index_t kv_head(index_t h) const { return h / group_size(); }
  /// The slope for query head h of batch entry b (0 when ALiBi is disabled).
  ALIBI_HOST_DEVICE float slope(index_t b, index_t h) const {
    if (!slopes.enabled) return 0.0f;
    if (slopes.values.data) return slopes.values(slopes.values.extents[0] == 1 ? 0 : b, h);
    const index_t global = slopes.global_heads > 0 ? slopes.global_heads : q_heads;
    return alibi::slope(slopes.head_offset + h, global, slopes.max_bias) * slopes.scale;
  }
  /// Whether some head has a positive slope, read on the host (generated slopes, or caller
  /// slopes in host memory): only then do the host kernels skip far tiles and visit tiles
  /// nearest-first, so that slopes of 0 compute the same bits as a call without ALiBi.
  bool any_positive_slope() const {
    if (!slopes.enabled) return false;
    const index_t rows = slopes.values.data ? slopes.values.extents[0] : 1;
    for (index_t b = 0; b < rows; ++b)
      for (index_t h = 0; h < q_heads; ++h)
        if (slope(b, h) > 0.0f) return true;
    return false;
  }
  /// Keys that the positional masks and the key length allow for query row i of batch b
  /// (the boolean key mask may still exclude some of them).
  ALIBI_HOST_DEVICE index_range key_range(index_t b, index_t i) const {
    return mask.key_range(q_offset(b) + i, k_offset(b), len_k(b));
  }
  /// A distance subtracted from every key distance of row i by the kernels; the softmax is
  /// invariant to it and logsumexp adds -slope * shift back. It is the distance to the
  /// nearest key the positional masks allow. Why: when every key is far from the query
  /// (q_len >> k_len, explicit offsets), unshifted fp32 scores near the row maximum are
  /// large (e.g. -0.25 * 766) and lose their low bits (ulp 1.5e-5); shifted, the scores
  /// that matter are small and keep them. `farthest` (a head with a negative slope, whose
  /// bias grows with distance, so that the farthest keys hold the row maximum) gives the
  /// distance to the farthest allowed key instead, for the same reason.
  ALIBI_HOST_DEVICE index_t distance_shift(index_t b, index_t i, bool farthest = false) const {
    const index_range r = key_range(b, i);
    if (r.empty()) return 0;
    const index_t qp = q_offset(b) + i, lo = k_offset(b) + r.begin, hi = k_offset(b) + r.end - 1;
    if (farthest) {
      const index_t to_lo = qp > lo ? qp - lo : lo - qp, to_hi = qp > hi ? qp - hi : hi - qp;
      return to_lo > to_hi ? to_lo : to_hi;
    }
    return qp < lo ? lo - qp : qp > hi ? qp - hi : 0;
  }
  ALIBI_HOST_DEVICE bool key_excluded(index_t b, index_t j) const {
    return key_mask.data != nullptr && key_mask(b, j);
  }

 private:
  ALIBI_HOST_DEVICE static index_t clamp_length(index_t n, index_t limit) {
    return n < 0 ? 0 : n > limit ? limit : n;
  }
};

}  // namespace detail
}  // namespace alibi
