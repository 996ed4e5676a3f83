// SPDX-License-Identifier: MIT
// The ALiBi bias and the masks, as small host/device functions: the one source of the
// bias/mask math for the reference, the CPU kernel, the CUDA kernel and the bias builder.
#pragma once

#include <cstdint>

#include "alibi/core/config.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// The ALiBi bias between a query at position q_pos and a key at k_pos:
/// -slope * |q_pos - k_pos|. Why from the integer distance: the distance is formed exactly
/// in 64-bit integers and converted once (exact below 2^24), so the bias has one rounding
/// whatever the absolute positions are; a "slope * j" form loses digits as positions grow.
/// `shift` (kernels only) is subtracted from the distance first; see
/// attention_problem::distance_shift.
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float alibi_bias(float slope, index_t q_pos, index_t k_pos,
                                                     index_t shift = 0) {
  const index_t d = q_pos >= k_pos ? q_pos - k_pos : k_pos - q_pos;
  return -slope * static_cast<float>(d - shift);
}

/// The bias in double precision (for the reference backend and the tests), with the same
/// optional distance shift as alibi_bias.
ALIBI_HOST_DEVICE inline double alibi_bias_exact(float slope, index_t q_pos, index_t k_pos,
                                                 index_t shift = 0) {
  const index_t d = q_pos >= k_pos ? q_pos - k_pos : k_pos - q_pos;
  return -static_cast<double>(slope) * static_cast<double>(d - shift);
}

/// A half-open index range [begin, end).
struct index_range {
  index_t begin = 0;
  index_t end = 0;
  ALIBI_HOST_DEVICE constexpr bool empty() const { return end <= begin; }
  ALIBI_HOST_DEVICE constexpr index_t size() const { return end > begin ? end - begin : 0; }
};

/// Positional masks. causal excludes keys after the query (k_pos > q_pos); a sliding window
/// excludes keys with q_pos - k_pos > window_left or k_pos - q_pos > window_right
/// (-1 = unbounded on that side). Both are relative to positions, so the same mask works
/// for prefill, decoding with a KV cache and q_len != k_len.
struct mask_spec {
  bool causal = false;
  index_t window_left = -1;
  index_t window_right = -1;

  /// The largest allowed k_pos - q_pos, or -1 when unbounded.
  ALIBI_HOST_DEVICE constexpr index_t right_limit() const { return causal ? 0 : window_right; }
  ALIBI_HOST_DEVICE constexpr bool allows(index_t q_pos, index_t k_pos) const {
    const index_t r = right_limit();
    if (r >= 0 && k_pos - q_pos > r) return false;
    if (window_left >= 0 && q_pos - k_pos > window_left) return false;
    return true;
  }
  /// Key indices j in [0, len_k) whose position k_offset + j the mask allows for a query at
  /// q_pos. The allowed set is always contiguous, which is what makes tile skipping exact.
  ALIBI_HOST_DEVICE constexpr index_range key_range(index_t q_pos, index_t k_offset,
                                                    index_t len_k) const {
    index_range r{0, len_k};
    const index_t right = right_limit();
    // The query's distance into the keys first: positions and lengths are below 2^60 in
    // magnitude, so d fits, and a window compared with d before it is added cannot overflow
    // however wide it is (a window of 2^63 - 1 reaches every key).
    const index_t d = q_pos - k_offset;
    if (window_left >= 0 && window_left < d) r.begin = d - window_left;
    if (right >= 0 && right < len_k - d - 1) r.end = d + right + 1;
    if (r.end < r.begin) r.end = r.begin;
    return r;
  }
  /// Whether any query at positions [q_pos, q_pos + q_len) is allowed any key at positions
  /// [k_offset, k_offset + len_k). By key_range, row q sees a key exactly when its distance
  /// into the keys d = q - k_offset has d >= -right_limit() (when that is >= 0) and
  /// d - len_k < window_left (when >= 0): both are monotone in d, so the run's last and first
  /// rows decide, in O(1).
  ALIBI_HOST_DEVICE constexpr bool any_allowed(index_t q_pos, index_t q_len, index_t k_offset,
                                               index_t len_k) const {
    if (q_len <= 0 || len_k <= 0) return false;
    const index_t right = right_limit(), d_first = q_pos - k_offset, d_last = d_first + q_len - 1;
    return (right < 0 || d_last >= -right) && (window_left < 0 || d_first - len_k < window_left);
  }
};

}  // namespace alibi
