// SPDX-License-Identifier: MIT
// The kernel behind <alibi/backend/eigen/attention_backward.hpp>. alibi::backend::eigen backward:
// the fused CPU gradients of ALiBi attention. Per (batch, kv head, key chunk) work item it streams
// key tiles; for each key tile it visits the query tiles of every query head of the group that meet
// it, recomputes the tile's probabilities from the forward's logsumexp with the forward's
// score-tile block, and accumulates
//   dV_j += P^T dO,  dP = dO V_j^T,  dS = P (dP - D),  dK_j += scale dS^T Q,
//   dQ += scale dS K_j
// through the register-blocked tile products (micro_kernel.hpp) on the tile. No L x L matrix
// exists; the extra memory is a few tiles per thread plus O(batch * heads * q_len) row statistics.
//
// Determinism: an item owns the dK/dV rows of its keys and, per key chunk, its own dQ
// accumulator, so there are no floating-point atomics; chunk accumulators are added in
// chunk order afterwards. The chunking depends on the shape only, so results are bitwise
// independent of the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/backend/eigen/attention_backward.hpp"
#include "alibi/backend/eigen/attention_kernel.hpp"
#include "alibi/backend/eigen/key_norm_pass.hpp"
#include "alibi/backend/eigen/score_tile.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// Tile and work-splitting constants of the backward.
struct backward_config {
  // Query rows per tile: the reductions over rows in P^T dO and dS^T Q are GEMMs with this
  // inner dimension, so it is larger than the forward's decode-friendly minimum.
  static constexpr index_t block_q = 256;
  // Items are (batch, kv head, key chunk). With fewer than min_items (batch, kv head)
  // pairs the keys are split into chunks (each with its own dQ accumulator, added in chunk
  // order), never below min_split_keys keys per chunk and never beyond max_partial_bytes of
  // accumulators. Shape-only, so thread-count independent.
  static constexpr index_t min_items = 16;
  static constexpr index_t min_split_keys = 1024;
  static constexpr index_t max_partial_bytes = index_t(64) << 20;
  // The largest |slope x distance shift| of a row (natural-log units) for which P is rebuilt
  // from the caller's logsumexp: its rounding then adds at most 4 x 2^-24 to P's relative
  // error. Beyond it the forward is recomputed (run_backward).
  static constexpr double max_lse_bias = 4.0;
  static_assert(block_q <= workspace::rows - 16, "a query tile must fit the score workspace");
  static_assert(min_split_keys % kernel_config::block_k == 0, "chunks hold whole key tiles");
};

/// Per-thread scratch of the backward, beside the forward's workspace (whose score-tile
/// buffers it shares).
struct backward_workspace {
  aligned_buffer<float> dp;  // (rows, block_k) in the score tile's layout: dP, then dS
  aligned_buffer<float> k;   // (block_k, padded D) a K tile with excluded rows zeroed
  // The item's query rows that meet its keys, of every head of the group, packed as columns
  // (pack_columns, leading dimension ld_cols): Q (D columns per head) and dO (Dv columns).
  aligned_buffer<float> q_cols, do_cols;
  index_t ld_cols = 0, cols_row0 = 0;  // ... holding the rows [cols_row0, cols_row0 + ld_cols)
  // Q and dO rows of a query tile with padded strides, for head dimensions that are not
  // whole packets (the products read whole packets of each row).
  aligned_buffer<float> q_rows, do_rows;
  void reserve(index_t d) {
    dp.reserve(static_cast<std::size_t>(workspace::rows * kernel_config::block_k));
    k.reserve(
        static_cast<std::size_t>(kernel_config::block_k * padded_stride(std::max<index_t>(d, 1))));
  }
};

inline backward_workspace& thread_backward_workspace() {
  thread_local backward_workspace w;
  return w;
}

/// The far-tile bound of the backward (docs/far-tile-skipping.md, "In the backward pass"). The
/// forward's logsumexp is the row's exact normalizer, so for a key tile entirely on one side of
/// query row i, nearest distance dn, the weight of that tile and of every farther key on that side
/// is
///   sum P_ij <= exp(|scale| |q_i| kmax - slope dn - lse_i) / (1 - exp(-slope))
/// (kmax bounds the norms of those keys: prefix/suffix maxima). A (query tile, key tile)
/// pair is skipped when that is <= 2^-25 for every row of the tile; with dslopes asked for,
/// the distance-weighted sum, bounded by the same times (dn + r / (1 - r)), r = exp(-slope),
/// must be <= 2^-25 too. All skipped tiles of a row on one side lie at or beyond the nearest
/// skipped one, whose bound covers them all: a row loses at most 2^-24 of its probability
/// mass (2^-24 of its distance-weighted mass).
struct backward_skip {
  far_tile_bound bound{};
  bool enabled = false, weighted = false;
  double log_r_term = 0.0;  // r / (1 - r)

  static backward_skip make(const attention_problem& p, float slope, bool on, bool weighted) {
    backward_skip s;
    s.enabled = on && slope > 0.0f && std::isfinite(slope);
    if (!s.enabled) return s;
    s.bound = far_tile_bound::make(p.scale, slope);
    s.weighted = weighted;
    const double r = std::exp(-static_cast<double>(slope));
    s.log_r_term = r / -std::expm1(-static_cast<double>(slope));
    return s;
  }

  /// Whether row i (query position qp, norm qn, logsumexp lse) may skip the keys at
  /// distance >= dn on one side, whose norms are at most kmax.
  bool row_negligible(float qn, float kmax, index_t dn, float lse) const {
    if (lse == neg_inf_f()) return true;  // no allowed key: nothing flows through this row
    if (!(lse == lse) || dn < 0) return false;
    double log_bound = bound.log_bound(qn, kmax, dn) - static_cast<double>(lse);
    if (weighted) log_bound += std::log(static_cast<double>(dn) + log_r_term);
    return log_bound <= skip_log_epsilon;  // false for NaN
  }
};

/// What one item (batch entry b, kv head hk, keys [kb, ke)) reads and writes.
struct backward_item {
  index_t b = 0, hk = 0, kb = 0, ke = 0;
  tensor_view<float, 4> dq;   // this chunk's dQ accumulator: the output, or a partial
  double* dslopes = nullptr;  // (group) per query head of the group, or null
};

/// The inputs of the backward kernel, fp32.
struct backward_inputs {
  const attention_problem* p = nullptr;
  tensor_view<const float, 4> q, k, v, dout;
  tensor_view<const float, 3> lse;
  tensor_view<float, 4> dk, dv;
  const float* delta = nullptr;   // (B, Hq, Lq) D_i = dO_i . O_i - dlse_i
  const float* lse2 = nullptr;    // (B, Hq, Lq) recomputed base-2 shifted logsumexps, or null
  const float* qnorm = nullptr;   // (B, Hq, Lq) |q_i| rounded up, when skipping
  const float* prefix = nullptr;  // (B, Hkv, grid) key-norm bounds, when skipping
  const float* suffix = nullptr;
  index_t grid = 0;
  bool skipping = false;
};

/// The valid rows [lo, hi) of batch entry b whose key ranges meet keys [j0, j1): the ranges
/// are monotone in the row (both ends non-decreasing), so these rows are contiguous.
inline void rows_meeting(const attention_problem& p, index_t b, index_t j0, index_t j1, index_t& lo,
                         index_t& hi) {
  const index_t lq = p.len_q(b);
  index_t a = 0, z = lq;  // first row whose range ends after j0
  while (a < z) {
    const index_t mid = a + (z - a) / 2;
    if (p.key_range(b, mid).end > j0)
      z = mid;
    else
      a = mid + 1;
  }
  lo = a;
  z = lq;  // first row whose range begins at or after j1
  while (a < z) {
    const index_t mid = a + (z - a) / 2;
    if (p.key_range(b, mid).begin >= j1)
      z = mid;
    else
      a = mid + 1;
  }
  hi = a;
}

/// x's rows (n, cols) (row stride ldx) where the products may read whole packets of each
/// row: in place when cols is whole packets, else copied into buf with a padded stride.
/// Returns the rows' pointer; ld receives their stride.
inline const float* packet_rows_of(const float* x, index_t ldx, index_t n, index_t cols,
                                   aligned_buffer<float>& buf, index_t& ld) {
  if (cols % lanes == 0) {
    ld = ldx;
    return x;
  }
  ld = padded_stride(cols);
  buf.reserve(static_cast<std::size_t>(std::max<index_t>(n, 1) * ld));
  for (index_t t = 0; t < n; ++t) std::copy(x + t * ldx, x + t * ldx + cols, buf.data() + t * ld);
  return buf.data();
}

/// The distance of a pair less its row's distance shift, as a weight of d(slope): a row's dS
/// sums to zero, so sum_j dS(t, j) (|q_pos - k_pos| - shift) is the exact d(slope) term, and
/// it does not multiply the fp32 residue of that zero sum by a far row's whole distance.
inline double dslope_distance(index_t q_pos, index_t k_pos, index_t shift) {
  const index_t x = q_pos - k_pos;
  return static_cast<double>((x < 0 ? -x : x) - shift);
}

/// Adds the tile's contribution to its head's d(slope): -sum of dS(t, j) (|q_pos - k_pos| -
/// shift) over the allowed pairs (ws.c0/c1), in double (see dslope_distance). ds(t, j): the
/// score gradient before the scale.
template <class DS>
void add_dslope(const backward_item& item, const item_rows& it, const score_tile_view& tile,
                const workspace& ws, const DS& ds) {
  const attention_problem& p = *it.p;
  const index_t qp0 = p.q_offset(it.b) + it.i0 + tile.ra, kp0 = p.k_offset(it.b) + tile.j0;
  double dslope = 0.0;
  for (index_t j = 0; j < tile.bk; ++j)
    for (index_t t = ws.c0[j]; t < ws.c1[j]; ++t)
      dslope -=
          static_cast<double>(ds(t, j)) * dslope_distance(qp0 + t, kp0 + j, ws.shift[tile.ra + t]);
  item.dslopes[it.h - it.hk * p.group_size()] += dslope;
}

/// The fast path of backward_tile for a column-major tile: the five products by the
/// register-blocked tile_product (micro_kernel.hpp), each with its operands in place or
/// packed once per item, and the gradients written as transposed column-major products
/// (dV^T += dO^T P, dK^T += Q^T dS, dQ^T += K^T dS^T: their rows are the head dimension,
/// their columns the keys or query rows).
inline void backward_tile_products(const backward_inputs& in, const backward_item& item,
                                   const item_rows& it, const score_tile_view& tile,
                                   const const_rows_map& qm, const const_rows_map& dom,
                                   workspace& ws, backward_workspace& bws) {
  const attention_problem& p = *in.p;
  const index_t ra = tile.ra, m = tile.m, bk = tile.bk, d = p.head_dim, dv = p.v_head_dim;
  const index_t b = it.b, h = it.h, i0 = it.i0, lds = tile.lds;
  const float* delta = in.delta + (b * p.q_heads + h) * p.q_len + i0 + ra;  // (m)
  const auto ld_of = [](const auto& t) { return t.strides[2]; };
  // K and V rows of the tile (bk, D) and (bk, Dv); excluded keys are unused memory (they
  // may hold NaN): their rows are zeroed in copies, so that they stay out of the products
  // (their probabilities and score gradients are exact zeros).
  // K is also copied when D is not whole packets: dQ^T's rows are the head dimension.
  const tile_rows<float> kr = rows_for_products(
      in.k.ptr(b, it.hk, tile.j0), ld_of(in.k), bk, d, ws, [&] { return bws.k.data(); },
      d % lanes != 0);
  const tile_rows<float> vr = rows_for_products(in.v.ptr(b, it.hk, tile.j0), ld_of(in.v), bk, dv,
                                                ws, [&] { return ws.tile_v(dv); });
  const float *k_rows = kr.data, *v_rows = vr.data;
  const index_t ldk = kr.ld, ldv = vr.ld;
  float* s = ws.s.data();
  float* dp = bws.dp.data();
  const index_t row0 = i0 + ra - bws.cols_row0;  // the tile's first row in the packed columns
  const float* do_cols = bws.do_cols.data() + (h - it.hk * p.group_size()) * dv * bws.ld_cols;
  // dP = dO V^T (m, bk); its padding rows are scratch (dO's packed padding rows are 0).
  tile_product<false, true>(m, bk, dv, do_cols + row0, bws.ld_cols, v_rows, ldv, dp, lds, nullptr,
                            false);
  index_t ld_do, ld_q;
  const float* do_rows =
      packet_rows_of(dom.row(ra).data(), dom.outerStride(), m, dv, bws.do_rows, ld_do);
  const float* q_rows = packet_rows_of(qm.row(ra).data(), qm.outerStride(), m, d, bws.q_rows, ld_q);
  // dV^T (Dv, bk) += dO^T P.
  rows_map dvm(in.dv.ptr(b, it.hk, tile.j0), bk, dv, Eigen::OuterStride<>(ld_of(in.dv)));
  tile_product<true, true>(dv, bk, m, do_rows, ld_do, s, lds, dvm.data(), dvm.outerStride(),
                           nullptr, true);
  // dS = P (dP - D): exact zeros where P is (masked pairs), since dP is finite there.
  cols_map pm(s, m, bk, Eigen::OuterStride<>(lds)), dsm(dp, m, bk, Eigen::OuterStride<>(lds));
  dsm.array() = pm.array() * (dsm.array().colwise() - Eigen::Map<const Eigen::ArrayXf>(delta, m));
  if (item.dslopes) add_dslope(item, it, tile, ws, dsm);
  dsm *= p.scale;
  // dK^T (D, bk) += Q^T dS; dQ^T (D, m) += K^T dS^T.
  rows_map dkm(in.dk.ptr(b, it.hk, tile.j0), bk, d, Eigen::OuterStride<>(ld_of(in.dk)));
  tile_product<true, true>(d, bk, m, q_rows, ld_q, dp, lds, dkm.data(), dkm.outerStride(), nullptr,
                           true);
  float* dq = item.dq.ptr(b, h, i0 + ra);
  tile_product<true, false>(d, m, bk, k_rows, ldk, dp, lds, dq, ld_of(item.dq), nullptr, true);
}

/// The backward of one (query tile, key tile) pair whose probabilities are in ws.s.
/// Fast path: five products (backward_tile_products for column-major tiles, Eigen's GEMM for
/// the row-major ones of fewer rows than a packet) and two element-wise passes. `careful`
/// (inputs with non-finite values): only the allowed pairs of the tile contribute, element
/// by element, so a NaN reaches exactly the gradients the mathematics sends it to.
inline void backward_tile(const backward_inputs& in, const backward_item& item, const item_rows& it,
                          const score_tile_view& tile, const const_rows_map& qm,
                          const const_rows_map& dom, bool careful, workspace& ws,
                          backward_workspace& bws) {
  const attention_problem& p = *in.p;
  const index_t ra = tile.ra, m = tile.m, bk = tile.bk, d = p.head_dim, dv = p.v_head_dim;
  const index_t b = it.b, h = it.h, i0 = it.i0;
  const float* delta = in.delta + (b * p.q_heads + h) * p.q_len + i0 + ra;  // (m)
  const_rows_map km(in.k.ptr(b, it.hk, tile.j0), bk, d, Eigen::OuterStride<>(in.k.strides[2]));
  const_rows_map vm(in.v.ptr(b, it.hk, tile.j0), bk, dv, Eigen::OuterStride<>(in.v.strides[2]));
  rows_map dkm(in.dk.ptr(b, it.hk, tile.j0), bk, d, Eigen::OuterStride<>(in.dk.strides[2]));
  rows_map dvm(in.dv.ptr(b, it.hk, tile.j0), bk, dv, Eigen::OuterStride<>(in.dv.strides[2]));
  rows_map dqm(item.dq.ptr(b, h, i0 + ra), m, d, Eigen::OuterStride<>(item.dq.strides[2]));
  const auto q_act = qm.middleRows(ra, m);    // (m, D)
  const auto do_act = dom.middleRows(ra, m);  // (m, Dv)
  auto at = [&](const float* x, index_t t, index_t j) {
    return tile.by_rows ? x[t * tile.lds + j] : x[j * tile.lds + t];
  };
  const index_t qp0 = p.q_offset(b) + i0 + ra, kp0 = p.k_offset(b) + tile.j0;

  if (careful) {
    const float* s = ws.s.data();
    double dslope = 0.0;
    for (index_t j = 0; j < bk; ++j)
      for (index_t t = ws.c0[j]; t < ws.c1[j]; ++t) {
        const float pr = at(s, t, j);
        const float ds = pr * (do_act.row(t).dot(vm.row(j)) - delta[t]);
        if (item.dslopes)
          dslope -= static_cast<double>(ds) * dslope_distance(qp0 + t, kp0 + j, ws.shift[ra + t]);
        const float dss = p.scale * ds;
        dqm.row(t) += dss * km.row(j);
        dkm.row(j) += dss * q_act.row(t);
        dvm.row(j) += pr * do_act.row(t);
      }
    if (item.dslopes) item.dslopes[h - it.hk * p.group_size()] += dslope;
    return;
  }

  if (!tile.by_rows) {
    backward_tile_products(in, item, it, tile, qm, dom, ws, bws);
    return;
  }
  // Excluded keys are unused memory (they may hold NaN): their K and V rows stay out of the
  // products (their probabilities and score gradients are exact zeros).
  const tile_rows<float> kr =
      rows_for_products(km.data(), km.outerStride(), bk, d, ws, [&] { return bws.k.data(); });
  const tile_rows<float> vr =
      rows_for_products(vm.data(), vm.outerStride(), bk, dv, ws, [&] { return ws.tile_v(dv); });
  const const_rows_map kz(kr.data, bk, d, Eigen::OuterStride<>(kr.ld));   // (bk, D)
  const const_rows_map vz(vr.data, bk, dv, Eigen::OuterStride<>(vr.ld));  // (bk, Dv)
  float* s = ws.s.data();
  float* dp = bws.dp.data();
  const Eigen::Map<const Eigen::ArrayXf> delta_m(delta, m);
  rows_map pm(s, m, bk, Eigen::OuterStride<>(tile.lds));    // (m, bk) P
  rows_map dpm(dp, m, bk, Eigen::OuterStride<>(tile.lds));  // (m, bk) dP, then dS
  dpm.noalias() = do_act * vz.transpose();
  dvm.noalias() += pm.transpose() * do_act;
  // dS = P (dP - D): exact zeros where P is (masked pairs), since dP is finite there.
  dpm.array() = pm.array() * (dpm.array().colwise() - delta_m);
  if (item.dslopes) add_dslope(item, it, tile, ws, dpm);
  dpm *= p.scale;
  dkm.noalias() += dpm.transpose() * q_act;
  dqm.noalias() += dpm * kz;
}

/// Replaces the scores of a tile by the probabilities 2^(s - lse2) against the forward's
/// logsumexp (base 2, with the row's distance shift added back, as the scores have it), or
/// against the recomputed one (in.lse2).
inline void probabilities_from_lse(const backward_inputs& in, const item_rows& it,
                                   const score_tile_view& tile, workspace& ws) {
  const attention_problem& p = *in.p;
  const index_t ra = tile.ra, m = tile.m, mp = packet_rows(m);
  const index_t row0 = (it.b * p.q_heads + it.h) * p.q_len + it.i0 + ra;
  for (index_t t = 0; t < mp; ++t) {
    float ref = 0.0f;  // padding rows, and rows without any allowed key (all scores -inf)
    if (t < m) {
      if (in.lse2) {
        if (in.lse2[row0 + t] != neg_inf_f()) ref = in.lse2[row0 + t];
      } else {
        const float lse = in.lse(it.b, it.h, it.i0 + ra + t);
        if (lse != neg_inf_f()) ref = (lse + it.slope * ws.shift_f[ra + t]) * log2e_f;
      }
    }
    ws.m_use[ra + t] = ref;
  }
  float* s = ws.s.data();
  if (tile.by_rows)
    for (index_t t = 0; t < m; ++t) exp_row(s + t * tile.lds, tile.bk, ws.m_use[ra + t]);
  else
    exp_tile(s, tile.lds, m, tile.bk, ws.m_use.data() + ra, ws.lsum.data() + ra);
}

/// Whether every row of query tile [i0, i1) of head h may skip key tile [j0, j1).
inline bool pair_negligible(const backward_inputs& in, const backward_skip& skip, index_t b,
                            index_t h, index_t i0, index_t i1, index_t j0, index_t j1) {
  if (!skip.enabled) return false;
  const attention_problem& p = *in.p;
  const index_t qo = p.q_offset(b), ko = p.k_offset(b), tidx = j0 / kernel_config::block_k;
  const index_t norms = (b * p.kv_heads + p.kv_head(h)) * in.grid + tidx;
  const index_t rows = (b * p.q_heads + h) * p.q_len;
  for (index_t i = i0; i < i1; ++i) {
    const index_t qp = qo + i;
    index_t dn;
    float kmax;
    if (ko + j1 - 1 < qp) {  // the tile is left of the row: it and everything left of it
      dn = qp - (ko + j1 - 1);
      kmax = in.prefix[norms];
    } else if (ko + j0 > qp) {
      dn = ko + j0 - qp;
      kmax = in.suffix[norms];
    } else {
      return false;
    }
    if (!skip.row_negligible(in.qnorm[rows + i], kmax, dn, in.lse(b, h, i))) return false;
  }
  return true;
}

/// Packs the Q and dO rows of every head of the item's group that meet the item's keys as
/// columns (bws.q_cols, bws.do_cols): the A operands of the tiles' Q K^T and dO V^T, packed
/// once per item rather than once per (query tile, key tile) pair.
inline void pack_item_columns(const backward_inputs& in, const backward_item& item,
                              backward_workspace& bws) {
  const attention_problem& p = *in.p;
  const index_t g = p.group_size(), d = p.head_dim, dv = p.v_head_dim;
  index_t lo, hi;
  rows_meeting(p, item.b, item.kb, item.ke, lo, hi);
  hi = std::max(lo, hi);
  // Room for a query tile's packet padding past the last row (zeros).
  bws.ld_cols = padded_stride(hi - lo) + 16;
  bws.cols_row0 = lo;
  bws.q_cols.reserve(static_cast<std::size_t>(g * std::max<index_t>(d, 1) * bws.ld_cols));
  bws.do_cols.reserve(static_cast<std::size_t>(g * std::max<index_t>(dv, 1) * bws.ld_cols));
  for (index_t u = 0; u < g; ++u) {
    const index_t h = item.hk * g + u;
    pack_columns(in.q.ptr(item.b, h, lo), in.q.strides[2], hi - lo, d, bws.ld_cols,
                 bws.q_cols.data() + u * d * bws.ld_cols, bws.ld_cols);
    pack_columns(in.dout.ptr(item.b, h, lo), in.dout.strides[2], hi - lo, dv, bws.ld_cols,
                 bws.do_cols.data() + u * dv * bws.ld_cols, bws.ld_cols);
  }
}

/// One item: every key tile of [kb, ke) against every query tile of the group's heads.
inline void backward_item_run(const backward_inputs& in, const backward_item& item, bool careful,
                              index_t& computed, index_t& skipped) {
  using cfg = kernel_config;
  const attention_problem& p = *in.p;
  const index_t b = item.b, g = p.group_size(), d = p.head_dim, dv = p.v_head_dim;
  workspace& ws = thread_workspace();
  ws.reserve(dv);
  backward_workspace& bws = thread_backward_workspace();
  bws.reserve(d);
  pack_item_columns(in, item, bws);
  for (index_t j0 = item.kb; j0 < item.ke; j0 += cfg::block_k) {
    const index_t j1 = std::min(item.ke, j0 + cfg::block_k);
    index_t lo, hi;
    rows_meeting(p, b, j0, j1, lo, hi);
    if (lo >= hi) continue;
    for (index_t h = item.hk * g; h < (item.hk + 1) * g; ++h) {
      const float slope = p.slope(b, h);
      const backward_skip skip =
          backward_skip::make(p, slope, in.skipping && !careful, item.dslopes != nullptr);
      for (index_t i0 = lo; i0 < hi; i0 += backward_config::block_q) {
        const index_t i1 = std::min(hi, i0 + backward_config::block_q);
        if (pair_negligible(in, skip, b, h, i0, i1, j0, j1)) {
          ++skipped;
          continue;
        }
        const item_rows it = prepare_rows(p, b, h, i0, i1 - i0, j0, j1, ws);
        const_rows_map qm(in.q.ptr(b, h, i0), i1 - i0, d, Eigen::OuterStride<>(in.q.strides[2]));
        const_rows_map dom(in.dout.ptr(b, h, i0), i1 - i0, dv,
                           Eigen::OuterStride<>(in.dout.strides[2]));
        score_tile_view tile;
        const kv_tile kv = kv_source<float>{in.k, in.v}.tile(b, item.hk, j0, j1 - j0);
        const float* q_cols = bws.q_cols.data() + (h - item.hk * g) * d * bws.ld_cols;
        if (!compute_score_tile(it, qm, kv, j0, false, ws, tile, q_cols + (i0 - bws.cols_row0),
                                bws.ld_cols))
          continue;
        ++computed;
        probabilities_from_lse(in, it, tile, ws);
        backward_tile(in, item, it, tile, qm, dom, careful, ws, bws);
      }
    }
  }
}

/// Zeroes what an item accumulates into: its keys' dK/dV rows, its dQ accumulator for the
/// group's heads (all rows: padded rows stay zero), its dslopes partials.
inline void reset_item(const attention_problem& p, const backward_inputs& in,
                       const backward_item& item) {
  const index_t g = p.group_size();
  for (index_t j = item.kb; j < item.ke; ++j) {
    std::fill(in.dk.ptr(item.b, item.hk, j), in.dk.ptr(item.b, item.hk, j) + p.head_dim, 0.0f);
    std::fill(in.dv.ptr(item.b, item.hk, j), in.dv.ptr(item.b, item.hk, j) + p.v_head_dim, 0.0f);
  }
  for (index_t h = item.hk * g; h < (item.hk + 1) * g; ++h)
    for (index_t i = 0; i < p.q_len; ++i)
      std::fill(item.dq.ptr(item.b, h, i), item.dq.ptr(item.b, h, i) + p.head_dim, 0.0f);
  if (item.dslopes) std::fill(item.dslopes, item.dslopes + g, 0.0);
}

/// Whether an item's results are all finite (finite inputs always give finite gradients;
/// otherwise the item is recomputed on the careful path).
inline bool item_finite(const attention_problem& p, const backward_inputs& in,
                        const backward_item& item) {
  const index_t g = p.group_size(), n = item.ke - item.kb;
  bool ok = all_finite(in.dk.ptr(item.b, item.hk, item.kb), in.dk.strides[2], n, p.head_dim) &&
            all_finite(in.dv.ptr(item.b, item.hk, item.kb), in.dv.strides[2], n, p.v_head_dim);
  for (index_t h = item.hk * g; ok && h < (item.hk + 1) * g; ++h)
    ok = all_finite(item.dq.ptr(item.b, h, 0), item.dq.strides[2], p.q_len, p.head_dim);
  for (index_t u = 0; ok && item.dslopes && u < g; ++u) ok = std::isfinite(item.dslopes[u]);
  return ok;
}

inline void run_backward(int threads, const attention_problem& p,
                         const attention_backward_tensors<float, float, float, float>& t_in) {
  using cfg = kernel_config;
  const auto& t = t_in;
  const index_t B = p.batch, Hq = p.q_heads, Hkv = p.kv_heads, Lq = p.q_len, Lk = p.k_len;
  const index_t D = p.head_dim, g = p.group_size();
  const int nthreads = resolve_threads(threads);
  // Gradients of empty problems: zero every element that exists.
  if (Hkv == 0 || Lq == 0 || Hq == 0) {
    for (index_t b = 0; b < B; ++b) {
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < Lq; ++i) std::fill(t.dq.ptr(b, h, i), t.dq.ptr(b, h, i) + D, 0.0f);
      for (index_t h = 0; h < Hkv; ++h)
        for (index_t j = 0; j < Lk; ++j) {
          std::fill(t.dk.ptr(b, h, j), t.dk.ptr(b, h, j) + D, 0.0f);
          std::fill(t.dv.ptr(b, h, j), t.dv.ptr(b, h, j) + p.v_head_dim, 0.0f);
        }
    }
    if (t.dslopes.data)
      for (index_t r = 0; r < t.dslopes.extents[0]; ++r)
        for (index_t h = 0; h < Hq; ++h) t.dslopes(r, h) = 0.0f;
    return;
  }

  // Work split: shape only (thread-count independent).
  const index_t pairs = B * Hkv;
  const index_t dq_bytes = B * Hq * Lq * D * static_cast<index_t>(sizeof(float));
  const index_t splits = std::max<index_t>(
      1, std::min(few_units_splits(pairs, backward_config::min_items, Lk,
                                   backward_config::min_split_keys),
                  1 + backward_config::max_partial_bytes / std::max<index_t>(dq_bytes, 1)));
  const index_t chunk =
      ((Lk + splits - 1) / splits + cfg::block_k - 1) / cfg::block_k * cfg::block_k;
  const index_t items = pairs * splits;

  // The calling thread's buffers (named by reference: see the forward's run()).
  thread_local aligned_buffer<float> delta_buf, qnorm_buf, prefix_buf, suffix_buf, partial_buf;
  thread_local aligned_buffer<double> dslope_buf;
  const index_t rows = B * Hq * Lq;
  delta_buf.reserve(static_cast<std::size_t>(rows));
  const index_t grid = (Lk + cfg::block_k - 1) / cfg::block_k;
  backward_inputs in;
  in.p = &p;
  in.q = t.q;
  in.k = t.k;
  in.v = t.v;
  in.dout = t.dout;
  in.lse = t.lse;
  in.dk = t.dk;
  in.dv = t.dv;
  in.grid = grid;
  in.skipping = p.skips_far_tiles(grid) && p.any_positive_slope();
  if (in.skipping) {
    qnorm_buf.reserve(static_cast<std::size_t>(rows));
    prefix_buf.reserve(static_cast<std::size_t>(pairs * grid));
    suffix_buf.reserve(static_cast<std::size_t>(pairs * grid));
    compute_key_norms(nthreads, p, kv_source<float>{t.k, t.v}, grid, prefix_buf.data(),
                      suffix_buf.data());
    in.prefix = prefix_buf.data();
    in.suffix = suffix_buf.data();
    in.qnorm = qnorm_buf.data();
  }
  // Row statistics: D_i = dO_i . O_i - dlse_i, and |q_i| (rounded up) for the skip bound.
  // Padded rows are never read. Why dlse_i enters D_i: d lse_i / d s_ij = P_ij, so a loss on
  // the logsumexp adds P_ij dlse_i to dS_ij = P_ij (dP_ij - D_i).
  float* delta = delta_buf.data();
  float* qnorm = qnorm_buf.data();
  // With dlse, a row's dS sums to dlse_i instead of 0, so the shifted distances of the
  // d(slope) sums (dslope_distance) leave out -dlse_i x shift_i per row with keys: summed
  // here per (batch, head), in double, and added at the end.
  const bool lse_shift_terms = t.dslopes.data && t.dlse.data;
  thread_local aligned_buffer<double> lse_shift_buf;
  if (lse_shift_terms) lse_shift_buf.reserve(static_cast<std::size_t>(B * Hq));
  double* lse_shift = lse_shift_buf.data();
  parallel_for(nthreads, B * Hq, [&](index_t bh) {
    const index_t b = bh / Hq, h = bh % Hq;
    double shift_term = 0.0;
    for (index_t i = 0; i < p.len_q(b); ++i) {
      const Eigen::Map<const Eigen::RowVectorXf> o(t.out.ptr(b, h, i), p.v_head_dim);
      const Eigen::Map<const Eigen::RowVectorXf> dO(t.dout.ptr(b, h, i), p.v_head_dim);
      const float g_lse = t.dlse.data ? t.dlse(b, h, i) : 0.0f;
      delta[bh * Lq + i] = o.dot(dO) - g_lse;
      if (lse_shift_terms && t.lse(b, h, i) != neg_inf_f())
        shift_term += static_cast<double>(g_lse) *
                      static_cast<double>(p.distance_shift(b, i, p.slope(b, h) < 0.0f));
      if (in.skipping) {
        const Eigen::Map<const Eigen::RowVectorXf> q(t.q.ptr(b, h, i), D);
        qnorm[bh * Lq + i] = static_cast<float>(q.cast<double>().norm() * (1 + 1e-6));
      }
    }
    if (lse_shift_terms) lse_shift[bh] = shift_term;
  });
  in.delta = delta;

  // A row whose nearest allowed key is far has an fp32 logsumexp that has lost the low bits
  // the kernels' shifted frame keeps (ulp(lse) ~ |slope x shift| 2^-23), and P rebuilt from
  // it is off by that factor for the whole row: for such calls the forward is run again to
  // get each row's base-2 logsumexp in the shifted frame. Causal self-attention has shift 0.
  thread_local aligned_buffer<float> lse2_buf, out_buf;
  // (A head with a negative slope is shifted by its farthest key, so its rows count as far
  // rows at once in a long call.)
  bool far_rows = false;
  for (index_t b = 0; b < B && !far_rows; ++b) {
    double steepest = 0.0, steepest_negative = 0.0;  // the batch entry's largest |slope|s
    for (index_t h = 0; h < Hq; ++h) {
      const double s = static_cast<double>(p.slope(b, h));
      steepest = std::max(steepest, std::fabs(s));
      if (s < 0.0) steepest_negative = std::max(steepest_negative, -s);
    }
    for (index_t i = 0; i < p.len_q(b) && !far_rows; ++i)
      far_rows =
          steepest * static_cast<double>(p.distance_shift(b, i)) > backward_config::max_lse_bias ||
          steepest_negative * static_cast<double>(p.distance_shift(b, i, true)) >
              backward_config::max_lse_bias;
  }
  if (far_rows) {
    lse2_buf.reserve(static_cast<std::size_t>(rows));
    out_buf.reserve(static_cast<std::size_t>(rows * p.v_head_dim));
    attention_problem pf = p;
    pf.lse = make_view(lse2_buf.data(), B, Hq, Lq);
    pf.lse_shifted_base2 = true;
    pf.stats = nullptr;
    run(nthreads, pf, t.q, kv_source<float>{t.k, t.v},
        make_view(out_buf.data(), B, Hq, Lq, p.v_head_dim));
    in.lse2 = lse2_buf.data();
  }

  const index_t partial_size = B * Hq * Lq * D;
  if (splits > 1) partial_buf.reserve(static_cast<std::size_t>((splits - 1) * partial_size));
  if (t.dslopes.data) dslope_buf.reserve(static_cast<std::size_t>(items * g));
  float* partial = partial_buf.data();
  double* dslope_part = dslope_buf.data();
  auto item_at = [&](index_t w) {
    backward_item it;
    const index_t c = w % splits, bh = w / splits;
    it.b = bh / Hkv;
    it.hk = bh % Hkv;
    it.kb = c * chunk;
    it.ke = std::min(Lk, (c + 1) * chunk);
    it.dq = c == 0 ? t.dq : make_view(partial + (c - 1) * partial_size, B, Hq, Lq, D);
    it.dslopes = t.dslopes.data ? dslope_part + w * g : nullptr;
    return it;
  };
  parallel_for(nthreads, items, [&](index_t w) {
    const backward_item item = item_at(w);
    index_t computed = 0, skipped = 0;
    reset_item(p, in, item);
    backward_item_run(in, item, false, computed, skipped);
    // Non-finite gradients come only from non-finite inputs: then the GEMMs may have sent
    // a NaN to gradients of pairs that never meet (0 * NaN); the careful path does not.
    if (!item_finite(p, in, item)) {
      reset_item(p, in, item);
      backward_item_run(in, item, true, computed, skipped);
    }
    if (p.stats) add_stats(p.stats, computed, skipped);
  });
  if (splits > 1)
    parallel_for(nthreads, B * Hq, [&](index_t bh) {
      const index_t b = bh / Hq, h = bh % Hq;
      for (index_t c = 1; c < splits; ++c) {
        const float* part = partial + (c - 1) * partial_size + bh * Lq * D;
        for (index_t i = 0; i < Lq; ++i) {
          Eigen::Map<Eigen::RowVectorXf>(t.dq.ptr(b, h, i), D) +=
              Eigen::Map<const Eigen::RowVectorXf>(part + i * D, D);
        }
      }
    });
  if (t.dslopes.data)
    for (index_t r = 0; r < t.dslopes.extents[0]; ++r)
      for (index_t h = 0; h < Hq; ++h) {
        double sum = 0.0;
        const index_t b_lo = t.dslopes.extents[0] == 1 ? 0 : r;
        const index_t b_hi = t.dslopes.extents[0] == 1 ? B : r + 1;
        for (index_t b = b_lo; b < b_hi; ++b) {
          for (index_t c = 0; c < splits; ++c)
            sum += dslope_part[((b * Hkv + p.kv_head(h)) * splits + c) * g + h % g];
          if (lse_shift_terms) sum -= lse_shift[b * Hq + h];
        }
        t.dslopes(r, h) = static_cast<float>(sum);
      }
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

namespace cpu {
inline namespace ALIBI_CPU_ISA {

template <class T>
void backward_kernel(int threads, const attention_problem& p,
                     const attention_backward_tensors<T, T, T, T>& t) {
  static_assert(std::is_same<T, float>::value, "the eigen backward computes in float");
  run_backward(threads, p, t);
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

}  // namespace detail
}  // namespace alibi
