// SPDX-License-Identifier: MIT
// The far-tile bound (ALiBi-specific): when the keys left on one side of a query row are far
// enough away, the ALiBi bias makes their total softmax weight provably negligible, and a
// kernel may skip them. One host/device function for every backend that skips (the C
// library's math functions, which CUDA also provides on the device).
#pragma once

#include <cmath>

#include "alibi/core/config.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {

/// Natural log of the skip threshold: the skipped weight stays below 2^-25 of the row's
/// running normalizer, so the skipped contribution is below 2^-24 max|v| (half an fp32 ulp of a
/// unit output) even counting the bound's own fp32 slack. The kept tiles are summed in
/// another order than without skipping, which adds ordinary fp32 reordering rounding.
inline constexpr double skip_log_epsilon = -25 * 0.69314718055994531;

/// An upper bound on the norm of a key whose squared norm, summed in float from its D
/// elements in any order, is `squared`. A float sum of D squares is within D * 2^-24
/// (relative) of the exact one; the margin covers that and the square root.
ALIBI_HOST_DEVICE inline float key_norm_bound(float squared, index_t head_dim) {
  return ::sqrtf(squared * (1.0f + 1e-5f + static_cast<float>(head_dim) * 1.2e-7f));
}

/// The bound for one (row, head): every score of the row against a key at distance dist is
/// at most c - slope * (dist - shift), with c = |scale| |q| max|k| (Cauchy-Schwarz). Keys on
/// one side of the row, the nearest at distance dn, have distinct distances dn, dn + 1, ...,
/// so their total weight exp(score - m) is at most
///   exp(c - slope (dn - shift) - m) / (1 - exp(-slope)).
/// When that is below 2^-25 l (l: the row's running normalizer relative to its running
/// maximum m, a lower bound on the final one), the keys are skipped. Valid for slope > 0
/// only; callers never skip otherwise (and never when a norm is NaN: comparisons with NaN
/// are false).
struct far_tile_bound {
  double abs_scale = 0.0;  // |scale|
  double slope = 0.0;
  double log_geo = 0.0;  // -log(1 - exp(-slope)): the geometric series over the distances

  ALIBI_HOST_DEVICE static far_tile_bound make(float scale, float slope) {
    far_tile_bound b;
    b.abs_scale = ::fabs(static_cast<double>(scale));
    b.slope = slope;
    b.log_geo = -::log(-::expm1(-static_cast<double>(slope)));
    return b;
  }

  /// Natural log of the bound on the total weight exp(score) of the keys on one side at
  /// distance >= dn (>= 1 from the row's own position), norms at most kmax, before the
  /// row's normalization: c - slope dn - log(1 - exp(-slope)). NaN when a norm is NaN.
  ALIBI_HOST_DEVICE double log_bound(float qnorm, float kmax, index_t dn) const {
    return abs_scale * qnorm * kmax - slope * static_cast<double>(dn) + log_geo;
  }

  /// Whether the keys of one side are negligible for a row whose running state (base-2
  /// units) is `st`, query norm `qnorm`, with key norms at most `kmax` there, the nearest
  /// at distance `dn` (>= 0), for a row whose scores were computed with distance shift
  /// `shift`.
  ALIBI_HOST_DEVICE bool negligible(const softmax_state& st, float qnorm, float kmax, index_t dn,
                                    index_t shift) const {
    double m, l;
    if (!natural_state(st, m, l)) return false;
    return log_bound(qnorm, kmax, dn - shift) - m <= skip_log_epsilon + ::log(l);  // NaN: false
  }

  /// The distance from which negligible() holds with these arguments: the root of its
  /// inequality in dn, shift + (|scale| qnorm kmax + log_geo - m - log(eps l)) / slope;
  /// +inf where it never holds (no weight yet, a NaN). A kernel that asks the side tests
  /// rarely uses it to choose where to ask (the tile boundary this distance reaches); the
  /// test itself still decides, since the root is rounded.
  ALIBI_HOST_DEVICE double min_distance(const softmax_state& st, float qnorm, float kmax,
                                        index_t shift) const {
    const double inf = HUGE_VAL;
    double m, l;
    if (!natural_state(st, m, l) || !(slope > 0.0)) return inf;
    // log_bound at distance 0: |scale| qnorm kmax + log_geo (up to an ulp where the compiler
    // contracts differently; the root only chooses where to ask).
    const double d = static_cast<double>(shift) +
                     (log_bound(qnorm, kmax, 0) - m - skip_log_epsilon - ::log(l)) / slope;
    return d == d ? d : inf;  // NaN norms: never
  }

 private:
  /// The row's running state in natural-log units: m, its running maximum, and l, its
  /// normalizer relative to m. False (nothing may be skipped) while the row has no weight
  /// yet or its maximum is not finite.
  ALIBI_HOST_DEVICE static bool natural_state(const softmax_state& st, double& m, double& l) {
    l = st.l;
    m = static_cast<double>(st.m) * 0.69314718055994531;  // base 2 -> natural log
    return l > 0.0 && m > -1e300 && m < 1e300;
  }
};

/// One row as the side tests see it: t0 = q_pos - (position of key index 0), its allowed
/// keys [begin, end) and distance shift (row_frame's fields), its query-norm bound and its
/// running state (base 2; any subset of the row's keys seen so far gives a valid, if weaker,
/// lower bound on the final normalizer).
struct far_row {
  index_t t0 = 0, begin = 0, end = 0, shift = 0;
  float qnorm = 0.0f;
  softmax_state state{};
};

/// Whether the row's keys left of key index x ([begin, min(x, end))) are negligible, their
/// norms at most kmax. True when the row has no key there; false when some of them are right
/// of the row's own position (the walk has not passed the row yet). Every backend that skips
/// asks this (and right_negligible) and nothing else.
ALIBI_HOST_DEVICE inline bool left_negligible(const far_tile_bound& bd, const far_row& r,
                                              float kmax, index_t x) {
  const index_t last = (x < r.end ? x : r.end) - 1;
  if (last < r.begin) return true;
  const index_t dn = r.t0 - last;
  return dn >= 0 && bd.negligible(r.state, r.qnorm, kmax, dn, r.shift);
}

/// Whether the row's keys from key index x on ([max(x, begin), end)) are negligible.
ALIBI_HOST_DEVICE inline bool right_negligible(const far_tile_bound& bd, const far_row& r,
                                               float kmax, index_t x) {
  const index_t first = x > r.begin ? x : r.begin;
  if (first >= r.end) return true;
  const index_t dn = first - r.t0;
  return dn >= 0 && bd.negligible(r.state, r.qnorm, kmax, dn, r.shift);
}

}  // namespace detail
}  // namespace alibi
