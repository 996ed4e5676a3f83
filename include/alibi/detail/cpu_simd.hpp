// SPDX-License-Identifier: MIT
// The per-row softmax loops of the fused CPU kernel, written with Eigen's packet primitives
// so that they use the widest vectors Eigen was compiled for (16 floats with AVX-512),
// whatever the compiler's auto-vectorization preferences. Each function has a scalar tail
// that performs the same operations on one element.
#pragma once

#include <cstdint>
#include <limits>

#include <Eigen/Core>

#include "alibi/detail/online_softmax.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {
namespace detail {
namespace cpu {

using packet = Eigen::internal::packet_traits<float>::type;
constexpr int lanes = Eigen::internal::unpacket_traits<packet>::size;

#if defined(EIGEN_VECTORIZE)
using int_packet = typename Eigen::internal::unpacket_traits<packet>::integer_packet;

/// exp_flush on a packet: the same steps as the scalar exp_flush (see there for the why).
ALIBI_FORCEINLINE packet exp_flush_packet(const packet& x) {
  namespace ei = Eigen::internal;
  const packet threshold = ei::pset1<packet>(exp_flush_threshold);
  const packet magic = ei::pset1<packet>(12582912.0f);
  // pmax returns its first argument when either is NaN, so a NaN x stays NaN here.
  const packet xc = ei::pmax(x, threshold);
  const packet z = ei::pmadd(xc, ei::pset1<packet>(1.44269504088896341f), magic);
  const packet n = ei::psub(z, magic);
  packet r = ei::pmadd(n, ei::pset1<packet>(-0.693145751953125f), xc);
  r = ei::pmadd(n, ei::pset1<packet>(-1.42860682030941723e-6f), r);
  packet p = ei::pset1<packet>(1.0f / 720.0f);
  p = ei::pmadd(p, r, ei::pset1<packet>(1.0f / 120.0f));
  p = ei::pmadd(p, r, ei::pset1<packet>(1.0f / 24.0f));
  p = ei::pmadd(p, r, ei::pset1<packet>(1.0f / 6.0f));
  p = ei::pmadd(p, r, ei::pset1<packet>(0.5f));
  p = ei::pmadd(p, r, ei::pset1<packet>(1.0f));
  p = ei::pmadd(p, r, ei::pset1<packet>(1.0f));
  const int_packet e = ei::plogical_shift_left<23>(ei::padd(
      ei::psub(ei::preinterpret<int_packet>(z), ei::pset1<int_packet>(float_to_bits(12582912.0f))),
      ei::pset1<int_packet>(127)));
  const packet y = ei::pmul(p, ei::preinterpret<packet>(e));
  return ei::pselect(ei::pcmp_lt(x, threshold), ei::pzero(x), y);
}
#endif

/// s[j] = scale * s[j] + neg_slope * (|base - j| - shift) for j in [0, n); returns the max.
/// base and shift are integers below 2^24, so each distance is exact (see alibi_bias).
ALIBI_FORCEINLINE float score_row(float* s, index_t n, float scale, float neg_slope, float base,
                                  float shift) {
  float mx = -std::numeric_limits<float>::infinity();
  index_t j = 0;
#if defined(EIGEN_VECTORIZE)
  namespace ei = Eigen::internal;
  if (n >= lanes) {
    const packet vscale = ei::pset1<packet>(scale), vslope = ei::pset1<packet>(neg_slope),
                 vshift = ei::pset1<packet>(shift), vbase = ei::pset1<packet>(base);
    packet vj = ei::plset<packet>(0.0f);
    const packet step = ei::pset1<packet>(static_cast<float>(lanes));
    packet vmax = ei::pset1<packet>(mx);
    for (; j + lanes <= n; j += lanes) {
      const packet dist = ei::psub(ei::pabs(ei::psub(vbase, vj)), vshift);
      const packet x = ei::pmadd(vscale, ei::ploadu<packet>(s + j), ei::pmul(vslope, dist));
      ei::pstoreu(s + j, x);
      vmax = ei::pmax(x, vmax);
      vj = ei::padd(vj, step);
    }
    mx = ei::predux_max(vmax);
  }
#endif
  for (; j < n; ++j) {
    const float dist = std::fabs(base - static_cast<float>(j)) - shift;
    const float x = scale * s[j] + neg_slope * dist;
    s[j] = x;
    mx = (x > mx || x != x) ? x : mx;
  }
  return mx;
}

/// s[j] = exp_flush(s[j] - m) for j in [0, n); returns the sum.
ALIBI_FORCEINLINE float exp_row(float* s, index_t n, float m) {
  float sum = 0.0f;
  index_t j = 0;
#if defined(EIGEN_VECTORIZE)
  namespace ei = Eigen::internal;
  if (n >= lanes) {
    const packet vm = ei::pset1<packet>(m);
    packet acc0 = ei::pset1<packet>(0.0f), acc1 = acc0;
    for (; j + 2 * lanes <= n; j += 2 * lanes) {
      const packet p0 = exp_flush_packet(ei::psub(ei::ploadu<packet>(s + j), vm));
      const packet p1 = exp_flush_packet(ei::psub(ei::ploadu<packet>(s + j + lanes), vm));
      ei::pstoreu(s + j, p0);
      ei::pstoreu(s + j + lanes, p1);
      acc0 = ei::padd(acc0, p0);
      acc1 = ei::padd(acc1, p1);
    }
    for (; j + lanes <= n; j += lanes) {
      const packet p0 = exp_flush_packet(ei::psub(ei::ploadu<packet>(s + j), vm));
      ei::pstoreu(s + j, p0);
      acc0 = ei::padd(acc0, p0);
    }
    sum = ei::predux(ei::padd(acc0, acc1));
  }
#endif
  for (; j < n; ++j) {
    s[j] = exp_flush(s[j] - m);
    sum += s[j];
  }
  return sum;
}

}  // namespace cpu
}  // namespace detail
}  // namespace alibi
