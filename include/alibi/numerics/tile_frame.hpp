// SPDX-License-Identifier: MIT
// The tile frame: per-row and per-tile arithmetic as host/device functions: which keys a row
// may see, and its ALiBi distances relative to a key tile in floats. The online softmax
// itself is the shared state of alibi/numerics/online_softmax.hpp. The CUDA kernels run
// these functions on the device, and the unit tests run them on the CPU against alibi_bias
// and the problem's own key_range. The CPU kernel resolves the same rows and distances from
// the same attention_problem predicates in backend/eigen/score_tile.hpp, with its own
// vectorized layout; moving it onto this frame would change its arithmetic, so it has not
// been done.
#pragma once

#include <cmath>
#include <cstdint>

#include "alibi/core/config.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {

/// Everything a kernel needs about one query row, resolved once per row from the problem.
struct row_frame {
  index_t begin = 0, end = 0;  // allowed key indices [begin, end); empty for padded rows
  index_t t0 = 0;              // q_pos - (position of key index 0)
  index_t shift = 0;           // attention_problem::distance_shift
  float slope = 0.0f;
};

/// The frame of query row i of head h, batch entry b. Rows at or past the entry's query
/// length get an empty key range (they produce zeros and logsumexp -inf). The shift is the
/// distance to the key with the row's largest bias: the nearest allowed key, or for a
/// negative slope (whose bias grows with distance) the farthest, so the scores near the row
/// maximum stay small and exact (attention_problem::distance_shift).
ALIBI_HOST_DEVICE inline row_frame make_row_frame(const attention_problem& p, index_t b, index_t h,
                                                  index_t i) {
  row_frame f;
  if (i >= p.len_q(b)) return f;
  const index_range r = p.key_range(b, i);
  f.begin = r.begin;
  f.end = r.end;
  f.t0 = p.q_offset(b) + i - p.k_offset(b);
  f.slope = p.slope(b, h);
  f.shift = p.distance_shift(b, i, f.slope < 0.0f);
  return f;
}

/// A row's distances within the key tile that starts at key index j0, as floats:
/// for the key j0 + c, |q_pos - k_pos| - shift = max(a - c, c - b). Why two terms: the
/// distance is t - c on the left of the query and c - t on its right (t = q_pos - k_pos(j0));
/// subtracting the shift on each side keeps both terms small where they matter, so they are
/// exact in float for distances below 2^24 whatever the absolute positions. The clamp keeps
/// the term of the far side finite and out of the max (it is then hugely negative).
/// `begin`/`end` are the allowed columns [begin, end) of this tile, clamped to [0, cols].
struct tile_frame {
  float a = 0.0f, b = 0.0f;
  int begin = 0, end = 0;
};

ALIBI_HOST_DEVICE ALIBI_FORCEINLINE index_t clamp_index(index_t x, index_t lo, index_t hi) {
  return x < lo ? lo : x > hi ? hi : x;
}

ALIBI_HOST_DEVICE ALIBI_FORCEINLINE tile_frame make_tile_frame(const row_frame& f, index_t j0,
                                                               int cols) {
  constexpr index_t lim = index_t(1) << 30;
  const index_t t = f.t0 - j0;
  tile_frame tf;
  tf.a = static_cast<float>(clamp_index(t - f.shift, -lim, lim));
  tf.b = static_cast<float>(clamp_index(t + f.shift, -lim, lim));
  tf.begin = static_cast<int>(clamp_index(f.begin - j0, 0, cols));
  tf.end = static_cast<int>(clamp_index(f.end - j0, 0, cols));
  if (tf.end < tf.begin) tf.end = tf.begin;
  return tf;
}

/// A row frame in 32-bit integers, for kernels whose registers are scarce (k_len < 2^28):
/// the allowed key range and t0 -+ shift, clamped so that every tile's clamped value below
/// is unchanged (tiles start at key indices below 2^28).
struct row_frame32 {
  std::int32_t a0 = 0, b0 = 0, begin = 0, end = 0;
};

ALIBI_HOST_DEVICE ALIBI_FORCEINLINE row_frame32 make_row_frame32(const row_frame& f) {
  constexpr index_t lo = -(index_t(1) << 30), hi = (index_t(1) << 30) + (index_t(1) << 28);
  row_frame32 r;
  r.a0 = static_cast<std::int32_t>(clamp_index(f.t0 - f.shift, lo, hi));
  r.b0 = static_cast<std::int32_t>(clamp_index(f.t0 + f.shift, lo, hi));
  r.begin = static_cast<std::int32_t>(clamp_index(f.begin, 0, hi));
  r.end = static_cast<std::int32_t>(clamp_index(f.end, 0, hi));
  return r;
}

/// The same tile frame as make_tile_frame(f, j0, cols) for j0 in [0, 2^28).
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE tile_frame make_tile_frame(const row_frame32& f,
                                                               std::int32_t j0, int cols) {
  constexpr std::int32_t lim = std::int32_t(1) << 30;
  auto clamp32 = [](std::int32_t x, std::int32_t lo, std::int32_t hi) {
    return x < lo ? lo : x > hi ? hi : x;
  };
  tile_frame tf;
  tf.a = static_cast<float>(clamp32(f.a0 - j0, -lim, lim));
  tf.b = static_cast<float>(clamp32(f.b0 - j0, -lim, lim));
  tf.begin = clamp32(f.begin - j0, 0, cols);
  tf.end = clamp32(f.end - j0, 0, cols);
  if (tf.end < tf.begin) tf.end = tf.begin;
  return tf;
}

/// |q_pos - k_pos| - shift for column c of the tile (exact below 2^24).
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float tile_distance(const tile_frame& tf, float c) {
  return fmaxf(tf.a - c, c - tf.b);
}

/// A score in base-2 units: (scale * q.k - slope * distance) * log2(e), the argument of the
/// online softmax. `scale_l2` = scale * log2(e), `neg_slope_l2` = -slope * log2(e).
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float score_l2(float dot, float scale_l2, float neg_slope_l2,
                                                   float distance) {
  return fmaf(dot, scale_l2, neg_slope_l2 * distance);
}

}  // namespace detail
}  // namespace alibi
