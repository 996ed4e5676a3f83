// SPDX-License-Identifier: MIT
// Far-chunk skipping for ring_attention: the plan that tells which pairs (query segment of
// this rank, key segment of a rank), or which keys of a pair, ALiBi makes negligible. It
// applies the far-tile bound of numerics/far_tiles.hpp at the scale of whole segments, with
// the key norms gathered from every rank. No MPI calls here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "alibi/core/bias.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/mpi/layout.hpp"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// The far-chunk plan of ring_attention: which pairs (query segment of this rank, key
/// segment of a rank) ALiBi makes negligible. The bound is far-tile skipping's
/// (far_tile_bound), with the row's logsumexp over its own segment (a lower bound of the
/// final one) as the normalizer and the largest key norm at or beyond the key segment on its
/// side, gathered from every rank.
struct far_chunks {
  attention_problem prob;
  index_t B = 0, Hq = 0, Hkv = 0, rows = 0;
  std::vector<segment> segs;          // every rank's segments, rank-major, global positions
  std::vector<float> kmax;            // (segs, batch, kv_heads): max |k| of each segment
  std::vector<float> qnorm;           // (batch, q_heads, rows): |q| of this rank's rows
  tensor_view<const float, 3> lse{};  // (batch, q_heads, rows): after the diagonal pairs
  std::vector<index_t> seq_len;       // (batch): each sequence's length (then padding)

  /// The largest key norm of (b, kv head hk) over the keys before `edge` (left) or from
  /// `edge` on (right). NaN when one of them is NaN: a NaN norm must keep its segment from
  /// being skipped.
  float beyond(bool left, index_t edge, index_t b, index_t hk) const {
    float m = 0.0f;
    for (std::size_t g = 0; g < segs.size(); ++g)
      if (left ? segs[g].pos + segs[g].len <= edge : segs[g].pos >= edge)
        m = max_keep_nan(m, kmax[(g * static_cast<std::size_t>(B) + static_cast<std::size_t>(b)) *
                                     static_cast<std::size_t>(Hkv) +
                                 static_cast<std::size_t>(hk)]);
    return m;
  }

  /// The distance (>= dn, the nearest key's on that side) from which every key on one side
  /// of a row is negligible: the smallest d with log_bound(d) - lse <= log 2^-25, or -1 when
  /// the row has no finite normalizer yet or a NaN defeats the bound.
  static index_t negligible_from(const far_tile_bound& bound, float qn, float km, double l,
                                 index_t dn) {
    if (!(l > -1e300 && l < 1e300)) return -1;
    const double x = (bound.log_bound(qn, km, 0) - l - skip_log_epsilon) / bound.slope;
    if (!(x < 1e18)) return -1;  // NaN, or beyond any position
    // x may be -inf or below int64 (tiny slopes, a large lse): clamped before the cast.
    index_t d = std::max<index_t>(dn, static_cast<index_t>(std::ceil(std::max(x, 0.0))));
    // The bound decreases with d; the rounding of x may leave it one step short.
    for (int step = 0; step < 2; ++step, ++d)
      if (bound.log_bound(qn, km, d) - l <= skip_log_epsilon) return d;
    return -1;
  }

  /// The keys of segment ks (global positions) that rows [i0, i1) of query segment qs and
  /// query heads [h0, h1), of every batch entry, need: the others (the far end of ks, on the
  /// far side of the rows) have, with every farther key, a weight below 2^-25 of each row's
  /// normalizer so far. Empty: the pair is negligible there. Overlapping segments: all keys.
  index_range needed(const segment& qs, const segment& ks, index_t i0, index_t i1, index_t h0,
                     index_t h1) const {
    const index_t kend = ks.pos + ks.len;
    const index_range all{ks.pos, kend};
    const bool left = kend <= qs.pos;
    if (!left && ks.pos < qs.pos + qs.len) return all;
    index_t first = kend, end = ks.pos;  // nothing yet; each row widens it
    for (index_t b = 0; b < B; ++b) {
      // Padding: rows and keys at or after the sequence's length take no part.
      const index_t len = seq_len[static_cast<std::size_t>(b)];
      if (len <= ks.pos) continue;
      const index_t rows_end = std::min(i1, std::max(i0, len - qs.pos));
      for (index_t h = h0; h < h1 && i0 < rows_end; ++h) {
        const float slope = prob.slope(b, h);
        if (!(slope > 0.0f) || !std::isfinite(slope)) return all;
        const auto bound = far_tile_bound::make(prob.scale, slope);
        const float km = beyond(left, left ? kend : ks.pos, b, prob.kv_head(h));
        for (index_t i = i0; i < rows_end; ++i) {
          const index_t qpos = qs.pos + i, row = qs.row + i;
          const index_t dn = left ? qpos - (kend - 1) : ks.pos - qpos;
          const index_t d =
              negligible_from(bound, qnorm[static_cast<std::size_t>((b * Hq + h) * rows + row)], km,
                              static_cast<double>(lse(b, h, row)), dn);
          if (d < 0) return all;
          if (left)
            first = std::min(first, qpos - d + 1);  // keys at qpos - d and before: negligible
          else
            end = std::max(end, qpos + d);  // keys at qpos + d and after: negligible
        }
      }
    }
    if (left) return {std::max(first, ks.pos), kend};
    return {ks.pos, std::min(end, kend)};
  }

  /// Whether key segment ks is negligible for every row of query segment qs.
  bool negligible(const segment& qs, const segment& ks) const {
    return needed(qs, ks, 0, qs.len, 0, Hq).empty();
  }
};

/// The Euclidean norm of a row of d floats, rounded up to a float (the bound must not
/// be below the exact norm).
inline float row_norm(const float* x, index_t d) {
  double s = 0;
  for (index_t j = 0; j < d; ++j) s += static_cast<double>(x[j]) * x[j];
  const double r = std::sqrt(s);
  const float f = static_cast<float>(r);
  return f < r ? std::nextafter(f, std::numeric_limits<float>::infinity()) : f;
}

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
