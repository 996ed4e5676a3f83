// SPDX-License-Identifier: MIT
// The score tile of the eigen backend's kernels, shared by the forward and the backward: a
// work item's rows and their allowed keys (item_rows, prepare_rows), and one tile's base-2
// scores scale * q.k + bias with the masks applied (begin_score_tile, Q K^T through the
// register-blocked tile_product or Eigen's GEMM, finish_score_tile), plus the per-thread workspace
// and the statistics counters.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/attention.hpp"
#include "alibi/backend/eigen/kv_tiles.hpp"
#include "alibi/backend/host/micro_kernel.hpp"
#include "alibi/backend/host/simd.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace cpu {

inline workspace& thread_workspace() {
  thread_local workspace w;
  return w;
}

/// Adds one work item's counts to the caller's counters.
inline void add_stats(attention_stats* stats, index_t computed, index_t skipped) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  stats->tiles_computed += computed;
  stats->tiles_skipped += skipped;
}

inline namespace ALIBI_CPU_ISA {

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using col_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using const_rows_map = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using rows_map = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using cols_map = Eigen::Map<col_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// One work item: query rows [i0, i0 + n) of head h of batch entry b (all within the
/// entry's query length) against the keys [kb, ke), with the per-row state in the thread's
/// workspace.
struct item_rows {
  const attention_problem* p = nullptr;
  index_t b = 0, h = 0, hk = 0, i0 = 0, n = 0;
  index_t qo = 0, ko = 0;  // positions of query row 0 and of key 0
  index_t ub = 0, ue = 0;  // union of the rows' key ranges within [kb, ke)
  float slope = 0.0f;
  float scale2 = 0.0f, slope2 = 0.0f, neg_slope2 = 0.0f;  // scale, slope, -slope in base 2
};

/// Resolves each row's allowed keys within [kb, ke), its distance shift, and resets its
/// softmax state.
inline item_rows prepare_rows(const attention_problem& p, index_t b, index_t h, index_t i0,
                              index_t n, index_t kb, index_t ke, workspace& ws) {
  item_rows it;
  it.p = &p;
  it.b = b;
  it.h = h;
  it.hk = p.kv_head(h);
  it.i0 = i0;
  it.n = n;
  it.qo = p.q_offset(b);
  it.ko = p.k_offset(b);
  it.slope = p.slope(b, h);
  it.scale2 = p.scale * log2e_f;
  it.slope2 = it.slope * log2e_f;
  it.neg_slope2 = -it.slope2;
  it.ub = ke;
  it.ue = kb;
  for (index_t r = 0; r < n; ++r) {
    const index_range kr = p.key_range(b, i0 + r);
    // Positional key ranges are monotone in the row (both ends non-decreasing), which makes
    // the valid rows of every key column contiguous.
    ws.begin[r] = std::clamp(kr.begin, kb, ke);
    ws.end[r] = std::clamp(kr.end, ws.begin[r], ke);
    ws.shift[r] = p.distance_shift(b, i0 + r, it.slope < 0.0f);
    ws.shift_f[r] = static_cast<float>(ws.shift[r]);
    ws.state[r] = softmax_state{};
    if (ws.begin[r] < ws.end[r]) {
      it.ub = std::min(it.ub, ws.begin[r]);
      it.ue = std::max(it.ue, ws.end[r]);
    }
  }
  return it;
}

/// Where a tile's scores are: local rows [ra, ra + m) of the item against keys
/// [j0, j0 + bk), in ws.s with leading dimension lds; row-major when the tile has fewer
/// rows than a packet (decoding: vectorized across keys), else column-major (vectorized
/// across rows).
struct score_tile_view {
  index_t j0 = 0, bk = 0, ra = 0, m = 0, lds = 0;
  bool by_rows = false;
  bool any_excluded = false;  // the key mask excludes some key of the tile
};

/// The first step of a score tile: which rows of the item meet the tile (tile.ra, tile.m),
/// the valid local rows [c0, c1) of each key column, and in ws.bad the keys whose V rows must
/// stay out of a P V product (excluded keys; with `careful`, non-finite V rows too). The
/// scores are row-major (by_rows) when the tile has fewer rows than a packet (decoding:
/// vectorized across keys) or when `force_rows`, else column-major (vectorized across rows).
/// Returns false when no row of the item meets the tile.
inline bool begin_score_tile(const item_rows& it, const kv_tile& kv, index_t j0, bool careful,
                             bool force_rows, workspace& ws, score_tile_view& tile) {
  using cfg = kernel_config;
  const attention_problem& p = *it.p;
  const index_t bk = std::min(cfg::block_k, it.ue - j0);
  // Only the rows whose key range meets this tile take part (causal and windowed tiles on
  // the diagonal band need a fraction of the rows).
  index_t ra = it.n, rb = 0;
  for (index_t r = 0; r < it.n; ++r)
    if (ws.begin[r] < j0 + bk && ws.end[r] > j0 && ws.begin[r] < ws.end[r]) {
      ra = std::min(ra, r);
      rb = r + 1;
    }
  if (ra >= rb) return false;
  const index_t m = rb - ra, dv = p.v_head_dim;
  tile = score_tile_view{j0, bk, ra, m, 0, force_rows || m < lanes, false};
  tile.lds = tile.by_rows ? padded_stride(cfg::block_k) : ws.ld();

  // Valid local rows of each key column; keys the key mask excludes get none.
  const bool* key_mask_row = p.key_mask.data ? p.key_mask.ptr(it.b) : nullptr;
  ws.bad_count = 0;
  if (!key_mask_row && !careful) {
    // No key is excluded or checked: [c0, c1) changes only at keys where a row's range
    // begins or ends, so the columns between two such keys are filled as one run (a decode
    // tile is one or two runs instead of a loop over its keys for every head).
    for (index_t j = 0, lo = 0, hi = 0; j < bk;) {
      const index_t key = j0 + j;
      while (lo < m && ws.end[ra + lo] <= key) ++lo;
      while (hi < m && ws.begin[ra + hi] <= key) ++hi;
      index_t next = j0 + bk;  // the next key where lo or hi moves
      if (lo < m) next = std::min(next, ws.end[ra + lo]);
      if (hi < m) next = std::min(next, ws.begin[ra + hi]);
      std::fill(ws.c0.data() + j, ws.c0.data() + (next - j0), lo);
      std::fill(ws.c1.data() + j, ws.c1.data() + (next - j0), std::max(lo, hi));
      j = next - j0;
    }
    return true;
  }
  for (index_t j = 0, lo = 0, hi = 0; j < bk; ++j) {
    const index_t key = j0 + j;
    while (lo < m && ws.end[ra + lo] <= key) ++lo;
    while (hi < m && ws.begin[ra + hi] <= key) ++hi;
    const bool excluded = key_mask_row && p.key_excluded(it.b, key);
    tile.any_excluded |= excluded;
    ws.c0[j] = lo;
    ws.c1[j] = excluded ? lo : std::max(lo, hi);
    // Excluded keys are unused memory (they may hold NaN): their V rows stay out of P V.
    if (excluded || (careful && !all_finite(kv.v.data() + j * kv.v.outerStride(), 0, 1, dv)))
      ws.bad[ws.bad_count++] = j;
  }
  return true;
}

/// The rows (n, cols) of a tile's K or V (row stride ld) as its products read them: in
/// place, or, when some must stay out of the products (the keys in ws.bad: their rows are
/// unused memory or non-finite) or `copy` asks for it, copied into dst() (row stride
/// padded_stride(cols)) with those rows zeroed.
template <class Dst>
tile_rows<float> rows_for_products(const float* x, index_t ld, index_t n, index_t cols,
                                   const workspace& ws, Dst&& dst, bool copy = false) {
  if (ws.bad_count == 0 && !copy) return {x, ld};
  const index_t ldc = padded_stride(std::max<index_t>(cols, 1));
  rows_map c(dst(), n, cols, Eigen::OuterStride<>(ldc));
  c = const_rows_map(x, n, cols, Eigen::OuterStride<>(ld));
  for (index_t u = 0; u < ws.bad_count; ++u) c.row(ws.bad[u]).setZero();
  return {c.data(), ldc};
}

/// The last step of a score tile: ws.s holds the dot products q.k of the tile's rows and
/// keys (in the tile's layout); turns them into the base-2 scores scale * q.k + bias, -inf
/// where a mask excludes the key, and each row's maximum into ws.mx[ra..].
inline void finish_score_tile(const item_rows& it, const score_tile_view& tile, workspace& ws) {
  const index_t ra = tile.ra, m = tile.m, mp = packet_rows(m), bk = tile.bk, j0 = tile.j0;
  for (index_t t = 0; t < mp; ++t)
    ws.base[ra + t] = t < m ? static_cast<float>(it.qo + it.i0 + ra + t - (it.ko + j0)) : 0.0f;
  tile_geometry g;
  g.rows = m;
  g.cols = bk;
  g.base = ws.base.data() + ra;
  g.shift = ws.shift_f.data() + ra;
  g.c0 = ws.c0.data();
  g.c1 = ws.c1.data();
  // Exact float distances need every |q_pos - k_pos| - shift of the tile below 2^24.
  const index_t q0 = it.qo + it.i0;
  const index_t dmax =
      std::max(std::abs(q0 + ra - (it.ko + j0 + bk - 1)), std::abs(q0 + ra + m - 1 - (it.ko + j0)));
  float* mx = ws.mx.data() + ra;
  float* s = ws.s.data();
  if (dmax >= (index_t(1) << 24)) {
    score_tile_far(s, tile.by_rows ? tile.lds : 1, tile.by_rows ? 1 : tile.lds, g, it.scale2,
                   it.slope2, q0 + ra, it.ko + j0, ws.shift.data() + ra, mx);
  } else if (!tile.by_rows) {
    score_tile(s, tile.lds, g, it.scale2, it.neg_slope2, mx);
  } else {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    for (index_t t = 0; t < m; ++t) {
      float* x = s + t * tile.lds;
      const index_t r = ra + t;
      mx[t] = score_row(x, bk, std::clamp<index_t>(ws.begin[r] - j0, 0, bk),
                        std::clamp<index_t>(ws.end[r] - j0, 0, bk), it.scale2, it.neg_slope2,
                        ws.base[r], ws.shift_f[r]);
      if (tile.any_excluded) {
        mx[t] = neg_inf;
        for (index_t j = 0; j < bk; ++j) {
          if (ws.c0[j] == ws.c1[j]) x[j] = neg_inf;
          mx[t] = max_keep_nan(mx[t], x[j]);
        }
      }
    }
  }
}

/// The score-tile building block, for the forward kernel and a backward one: the base-2
/// scores scale * q.k + bias of the tile's rows and keys, -inf where a mask excludes the
/// key, into ws.s, and each row's maximum into ws.mx[ra..] (begin_score_tile, the Q K^T
/// product by Eigen's GEMM, finish_score_tile). kv holds the tile's keys [j0, j0 + bk) in
/// fp32. Returns false when no row of the item meets the tile.
/// q_cols: nullptr, or the item's query rows packed by pack_columns (leading dimension
/// ldq, zeros past the item's rows), for the column-major tiles' product by the
/// register-blocked tile_product.
inline bool compute_score_tile(const item_rows& it, const const_rows_map& qm, const kv_tile& kv,
                               index_t j0, bool careful, workspace& ws, score_tile_view& tile,
                               const float* q_cols = nullptr, index_t ldq = 0) {
  if (!begin_score_tile(it, kv, j0, careful, false, ws, tile)) return false;
  const auto km = kv.k.topRows(tile.bk);  // (bk, D)
  float* s = ws.s.data();
  if (q_cols && !tile.by_rows)
    // Rows [m, packet_rows(m)) of the tile are scratch (finish_score_tile masks them).
    tile_product<false, true>(tile.m, tile.bk, qm.cols(), q_cols + tile.ra, ldq, km.data(),
                              km.outerStride(), s, tile.lds, nullptr, false);
  else if (tile.by_rows)
    rows_map(s, tile.m, tile.bk, Eigen::OuterStride<>(tile.lds)).noalias() =
        qm.middleRows(tile.ra, tile.m) * km.transpose();
  else
    cols_map(s, tile.m, tile.bk, Eigen::OuterStride<>(tile.lds)).noalias() =
        qm.middleRows(tile.ra, tile.m) * km.transpose();
  finish_score_tile(it, tile, ws);
  return true;
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
