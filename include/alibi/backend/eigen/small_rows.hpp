// SPDX-License-Identifier: MIT
// The two products of the fused CPU kernel for tiles with few query rows (decoding, a few
// speculative tokens, the query heads of one GQA group together): S = Q K^T and O += P V
// over one key tile, written with Eigen's packet primitives. Why not Eigen's GEMM: with a
// handful of rows a GEMM call packs the K or V tile before using it, and a GEMV streams it
// once per row; these loops read each K and V row once for all the rows, which is what keeps
// a decode step at the speed of memory.
//
// Every output element is accumulated in an order that depends only on its own row (packets
// along the head dimension, then the tail; keys in ascending order), never on which or how
// many other rows share the call: a query head computes the same bits alone or in a group.
#pragma once

#include <algorithm>

#include <Eigen/Core>

#include "alibi/backend/eigen/simd.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// The dot products of R rows q[t] with J key rows k[u] (d floats each), each pair with one
/// accumulator: packets along d, reduced, then the scalar tail. R x J independent chains keep
/// the FMA units busy whatever the number of rows; each result's order is its own.
template <int R, int J>
ALIBI_FORCEINLINE void dot_block(const float* const* q, const float* const* k, index_t d,
                                 float (*out)[J]) {
  namespace ei = Eigen::internal;
  const index_t dp = d / lanes * lanes;
  packet acc[R][J];
  for (int t = 0; t < R; ++t)
    for (int u = 0; u < J; ++u) acc[t][u] = ei::pset1<packet>(0.0f);
  for (index_t e = 0; e < dp; e += lanes) {
    packet kp[J];
    for (int u = 0; u < J; ++u) kp[u] = ei::ploadu<packet>(k[u] + e);
    for (int t = 0; t < R; ++t) {
      const packet qp = ei::ploadu<packet>(q[t] + e);
      for (int u = 0; u < J; ++u) acc[t][u] = ei::pmadd(qp, kp[u], acc[t][u]);
    }
  }
  for (int t = 0; t < R; ++t)
    for (int u = 0; u < J; ++u) {
      float tail = 0.0f;
      for (index_t e = dp; e < d; ++e) tail += q[t][e] * k[u][e];
      out[t][u] = ei::predux(acc[t][u]) + tail;
    }
}

/// s[t][j] = q[t] . k_j for R rows and the keys j < bk (row j at k + j * ldk), J keys at a
/// time.
template <int R, int J, class Prefetch>
void scores_rows(const float* const* q, const float* k, index_t ldk, index_t bk, index_t d,
                 float* const* s, Prefetch&& prefetch) {
  float out[R][J];
  index_t j = 0;
  for (; j + J <= bk; j += J) {
    const float* kr[J];
    for (int u = 0; u < J; ++u) {
      prefetch(j + u);
      kr[u] = k + (j + u) * ldk;
    }
    dot_block<R, J>(q, kr, d, out);
    for (int t = 0; t < R; ++t)
      for (int u = 0; u < J; ++u) s[t][j + u] = out[t][u];
  }
  for (; j < bk; ++j) {
    prefetch(j);
    const float* kr[1] = {k + j * ldk};
    float one[R][1];
    dot_block<R, 1>(q, kr, d, one);
    for (int t = 0; t < R; ++t) s[t][j] = one[t][0];
  }
}

/// s[t][j] = q[t] . k_j for the rows t < m (q[t]: d floats) and the keys j < bk of a key
/// tile (row j at k + j * ldk). prefetch(j) is called once per key j: the caller requests
/// rows from memory meanwhile.
template <class Prefetch>
void small_scores(const float* const* q, index_t m, const float* k, index_t ldk, index_t bk,
                  index_t d, float* const* s, Prefetch&& prefetch) {
  // Blocks of 4, 2 and 1 rows, with 2, 4 and 8 keys at a time: 8 chains each. The prefetch
  // runs with the first block only.
  auto none = [](index_t) {};
  index_t t = 0;
  for (; t + 4 <= m; t += 4)
    t == 0 ? scores_rows<4, 2>(q + t, k, ldk, bk, d, s + t, prefetch)
           : scores_rows<4, 2>(q + t, k, ldk, bk, d, s + t, none);
  for (; t + 2 <= m; t += 2)
    t == 0 ? scores_rows<2, 4>(q + t, k, ldk, bk, d, s + t, prefetch)
           : scores_rows<2, 4>(q + t, k, ldk, bk, d, s + t, none);
  for (; t < m; ++t)
    t == 0 ? scores_rows<1, 8>(q + t, k, ldk, bk, d, s + t, prefetch)
           : scores_rows<1, 8>(q + t, k, ldk, bk, d, s + t, none);
}

/// o[c * lanes, (c + C) * lanes) += sum over keys j in [jb, je) of p[j] v_j for one row: the
/// C packets of o stay in registers while the keys go by in ascending order (v_j at
/// v + j * ldv). Each key's C products are independent, so the FMA units stay busy even
/// though every packet's own sum is a chain over the keys.
template <int C>
ALIBI_FORCEINLINE void pv_packets(const float* p, const float* v, index_t ldv, index_t jb,
                                  index_t je, float* o) {
  namespace ei = Eigen::internal;
  packet acc[C];
  for (int c = 0; c < C; ++c) acc[c] = ei::ploadu<packet>(o + c * lanes);
  for (index_t j = jb; j < je; ++j) {
    const packet w = ei::pset1<packet>(p[j]);
    const float* vj = v + j * ldv;
    for (int c = 0; c < C; ++c) acc[c] = ei::pmadd(w, ei::ploadu<packet>(vj + c * lanes), acc[c]);
  }
  for (int c = 0; c < C; ++c) ei::pstoreu(o + c * lanes, acc[c]);
}

/// o[e] += sum over keys j in [jb, je) of p[j] v_j[e] for one row, keys in ascending order
/// (v_j at v + j * ldv, dv floats): up to 8 packets of o at a time (128 floats with AVX-512,
/// a whole row for head dims up to 128), then the scalar tail. A V row is read front to back
/// for each group of packets, in ascending keys: one contiguous run the hardware prefetcher
/// follows.
inline void pv_row(const float* p, const float* v, index_t ldv, index_t jb, index_t je, index_t dv,
                   float* o) {
  const index_t dp = dv / lanes * lanes;
  index_t e = 0;
  for (; e + 8 * lanes <= dp; e += 8 * lanes) pv_packets<8>(p, v + e, ldv, jb, je, o + e);
  if (e + 4 * lanes <= dp) {
    pv_packets<4>(p, v + e, ldv, jb, je, o + e);
    e += 4 * lanes;
  }
  if (e + 2 * lanes <= dp) {
    pv_packets<2>(p, v + e, ldv, jb, je, o + e);
    e += 2 * lanes;
  }
  if (e < dp) pv_packets<1>(p, v + e, ldv, jb, je, o + e);
  for (e = dp; e < dv; ++e) {
    float a = o[e];
    for (index_t j = jb; j < je; ++j) a += p[j] * v[j * ldv + e];
    o[e] = a;
  }
}

/// How many key rows of `width` floats make 16 KiB (at least 8): a block of K or V rows that
/// stays in L1 while every row of a small call goes over it.
inline index_t l1_block_keys(index_t width) {
  return std::max<index_t>(8, index_t(4096) / std::max<index_t>(width, 1));
}

/// o[t] += sum over keys j < bk not listed in skip[0, nskip) (ascending) of p[t][j] v_j, for
/// the rows t < m (o[t]: dv floats). Each output element sums its keys in ascending order,
/// whatever the blocking.
inline void small_pv(const float* const* p, index_t m, const float* v, index_t ldv, index_t bk,
                     index_t dv, const index_t* skip, index_t nskip, float* const* o) {
  // Keys in blocks of at most 16 KiB of V rows, and within a block the rows one after the
  // other: the block's V rows, read from memory for the first row, are still in L1 for the
  // next ones (a whole tile's V, 64 KiB at Dv = 128, is not), so a GQA group reads each V
  // row from beyond L1 once. Each output element still sums its keys in ascending order.
  const index_t block = l1_block_keys(dv);
  for (index_t u = 0, jb = 0; u <= nskip; ++u) {
    const index_t je = u < nskip ? skip[u] : bk;
    for (index_t j = jb; j < je; j += block)
      for (index_t t = 0; t < m; ++t) pv_row(p[t], v, ldv, j, std::min(je, j + block), dv, o[t]);
    jb = je + 1;
  }
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
