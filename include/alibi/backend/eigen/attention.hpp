// SPDX-License-Identifier: MIT
// alibi::backend::eigen: the fused CPU attention. Flash-attention style: per (batch, head,
// query tile) it streams key tiles, S = Q K^T through Eigen's GEMM, adds the ALiBi bias and
// the masks in one pass, keeps an online softmax (running max and sum) and accumulates
// O += P V through Eigen's GEMM. The L x L score or bias matrix never exists.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/attention.hpp"
#include "alibi/backend/eigen/parallel.hpp"
#include "alibi/backend/eigen/simd.hpp"
#include "alibi/backend/eigen/workspace.hpp"
#include "alibi/detail/far_tiles.hpp"
#include "alibi/detail/online_softmax.hpp"
#include "alibi/merge.hpp"

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

/// Whether every element of a (rows, cols) block with row stride ld is finite. x * 0 is 0
/// for finite x and NaN for Inf/NaN; 16 independent lanes let the compiler vectorize it.
inline bool all_finite(const float* data, index_t ld, index_t rows, index_t cols) {
  float acc[16] = {};
  for (index_t r = 0; r < rows; ++r) {
    const float* row = data + r * ld;
    index_t c = 0;
    for (; c + 16 <= cols; c += 16)
      for (int t = 0; t < 16; ++t) acc[t] += row[c + t] * 0.0f;
    for (; c < cols; ++c) acc[0] += row[c] * 0.0f;
  }
  float total = 0.0f;
  for (float a : acc) total += a;
  return total == 0.0f;
}

/// Upper bounds on key norms for the far-tile bound: for one (batch, kv head), over the key
/// grid tiles [t * block_k, (t + 1) * block_k), prefix[t] = max |k_j| for j < (t + 1) *
/// block_k and suffix[t] = max |k_j| for j >= t * block_k. Null when skipping is off.
struct key_norms {
  const float* prefix = nullptr;
  const float* suffix = nullptr;
};

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
    ws.shift[r] = p.distance_shift(b, i0 + r);
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

/// The score-tile building block, for the forward kernel and a backward one: the base-2
/// scores scale * q.k + bias of the tile's rows and keys, -inf where a mask excludes the
/// key, into ws.s, and each row's maximum into ws.mx[ra..]. Also lists in ws.bad the keys
/// whose V rows must stay out of a P V product (excluded keys; with `careful`, non-finite
/// V rows too). Returns false when no row of the item meets the tile.
inline bool compute_score_tile(const item_rows& it, const const_rows_map& qm,
                               const tensor_view<const float, 4>& k,
                               const tensor_view<const float, 4>& v, index_t j0, bool careful,
                               workspace& ws, score_tile_view& tile) {
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
  const index_t m = rb - ra, mp = packet_rows(m), d = p.head_dim, dv = p.v_head_dim;
  tile = score_tile_view{j0, bk, ra, m, 0, m < lanes, false};
  tile.lds = tile.by_rows ? padded_stride(cfg::block_k) : padded_stride(workspace::rows);

  // Valid local rows of each key column; keys the key mask excludes get none.
  const bool* key_mask_row = p.key_mask.data ? p.key_mask.ptr(it.b) : nullptr;
  ws.bad_count = 0;
  for (index_t j = 0, lo = 0, hi = 0; j < bk; ++j) {
    const index_t key = j0 + j;
    while (lo < m && ws.end[ra + lo] <= key) ++lo;
    while (hi < m && ws.begin[ra + hi] <= key) ++hi;
    const bool excluded = key_mask_row && p.key_excluded(it.b, key);
    tile.any_excluded |= excluded;
    ws.c0[j] = lo;
    ws.c1[j] = excluded ? lo : std::max(lo, hi);
    // Excluded keys are unused memory (they may hold NaN): their V rows stay out of P V.
    if (excluded || (careful && !all_finite(v.ptr(it.b, it.hk, key), 0, 1, dv)))
      ws.bad[ws.bad_count++] = j;
  }
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
      std::max(std::abs(q0 + ra - (it.ko + j0 + bk - 1)), std::abs(q0 + rb - 1 - (it.ko + j0)));
  float* mx = ws.mx.data() + ra;
  float* s = ws.s.data();
  const_rows_map km(k.ptr(it.b, it.hk, j0), bk, d, Eigen::OuterStride<>(k.strides[2]));  // (bk, D)
  if (tile.by_rows)
    rows_map(s, m, bk, Eigen::OuterStride<>(tile.lds)).noalias() =
        qm.middleRows(ra, m) * km.transpose();
  else
    cols_map(s, m, bk, Eigen::OuterStride<>(tile.lds)).noalias() =
        qm.middleRows(ra, m) * km.transpose();

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
  return true;
}

/// The online-softmax step of a scored tile: moves each row's state to its new maximum,
/// turns the scores into probabilities in place, rescales the rows' accumulated output o
/// (n, Dv) and adds P V.
inline void accumulate_tile(const item_rows& it, const score_tile_view& tile,
                            const tensor_view<const float, 4>& v, workspace& ws, cols_map& o) {
  const index_t ra = tile.ra, m = tile.m, mp = packet_rows(m), bk = tile.bk;
  const index_t dv = it.p->v_head_dim;
  bool rescale = false;
  for (index_t t = 0; t < mp; ++t) {
    if (t >= m) {
      ws.m_use[ra + t] = 0.0f;  // padding rows: 2^(-inf - 0) = 0
      continue;
    }
    const softmax_step st = ws.state[ra + t].rescale(ws.mx[ra + t]);
    ws.m_use[ra + t] = st.ref;
    ws.alpha[ra + t] = st.factor;
    rescale |= st.factor != 1.0f;
  }
  float* s = ws.s.data();
  if (tile.by_rows)
    for (index_t t = 0; t < m; ++t)
      ws.lsum[ra + t] = exp_row(s + t * tile.lds, bk, ws.m_use[ra + t]);
  else
    exp_tile(s, tile.lds, m, bk, ws.m_use.data() + ra, ws.lsum.data() + ra);
  for (index_t r = ra; r < ra + m; ++r)
    ws.state[r].add(softmax_step{ws.m_use[r], ws.alpha[r]}, ws.lsum[r]);

  auto o_act = o.middleRows(ra, m);  // (m, Dv)
  if (rescale) o_act.array().colwise() *= Eigen::Map<const Eigen::ArrayXf>(ws.alpha.data() + ra, m);
  const_rows_map vm(v.ptr(it.b, it.hk, tile.j0), bk, dv,
                    Eigen::OuterStride<>(v.strides[2]));  // (bk, Dv)
  auto multiply = [&](const auto& p) {  // p: (m, bk) probabilities, in the tile's layout
    if (ws.bad_count == 0) {
      o_act.noalias() += p * vm;
      return;
    }
    rows_map vc(ws.v.data(), bk, dv, Eigen::OuterStride<>(padded_stride(dv)));
    vc = vm;
    for (index_t u = 0; u < ws.bad_count; ++u) vc.row(ws.bad[u]).setZero();
    o_act.noalias() += p * vc;
    // A non-finite V row still reaches exactly the rows that attend to it, even where its
    // weight rounded to 0 (0 * NaN = NaN, as the mathematics has it).
    for (index_t u = 0; u < ws.bad_count; ++u) {
      const index_t j = ws.bad[u];
      for (index_t t = ws.c0[j]; t < ws.c1[j]; ++t) o_act.row(t) += p(t, j) * vm.row(j);
    }
  };
  if (tile.by_rows)
    multiply(rows_map(s, m, bk, Eigen::OuterStride<>(tile.lds)));
  else
    multiply(cols_map(s, m, bk, Eigen::OuterStride<>(tile.lds)));
}

/// Far-tile skipping for one item (ALiBi-specific; the bound is detail::far_tile_bound):
/// whether the keys left on one side are negligible for every row.
class far_tile_skipper {
 public:
  far_tile_skipper(const item_rows& it, const const_rows_map& qm, key_norms norms, workspace& ws)
      : it_(it), norms_(norms), ws_(ws) {
    enabled_ = norms.prefix != nullptr && it.slope > 0.0f && std::isfinite(it.slope);
    if (!enabled_) return;
    bound_ = far_tile_bound::make(it.p->scale, it.slope);
    for (index_t r = 0; r < it.n; ++r)
      ws.qnorm[r] = static_cast<float>(qm.row(r).cast<double>().norm() * (1 + 1e-6));
  }
  bool enabled() const { return enabled_; }

  /// Keys [ub, x) remain on the left.
  bool left(index_t x) const {
    const float kmax = norms_.prefix[(x - 1) / kernel_config::block_k];
    for (index_t r = 0; r < it_.n; ++r) {
      const index_t last = std::min(x, ws_.end[r]) - 1;
      if (last < ws_.begin[r]) continue;  // the row has no key there
      if (!row_negligible(r, it_.qo + it_.i0 + r - (it_.ko + last), kmax)) return false;
    }
    return true;
  }
  /// Keys [x, ue) remain on the right.
  bool right(index_t x) const {
    const float kmax = norms_.suffix[x / kernel_config::block_k];
    for (index_t r = 0; r < it_.n; ++r) {
      const index_t first = std::max(x, ws_.begin[r]);
      if (first >= ws_.end[r]) continue;
      if (!row_negligible(r, it_.ko + first - (it_.qo + it_.i0 + r), kmax)) return false;
    }
    return true;
  }

 private:
  bool row_negligible(index_t r, index_t dn, float kmax) const {
    return dn >= 0 && bound_.negligible(ws_.state[r], ws_.qnorm[r], kmax, dn, ws_.shift[r]);
  }
  const item_rows& it_;
  key_norms norms_;
  workspace& ws_;
  far_tile_bound bound_{};
  bool enabled_ = false;
};

/// Visits the item's key tiles nearest-first: the tile holding the key nearest the middle
/// row, then outward to the left, then to the right, so that the running maxima are good
/// before the far-tile bound is consulted. Returns the number of tiles skipped.
template <class F>
index_t visit_tiles(const item_rows& it, const far_tile_skipper& skip, F&& process) {
  constexpr index_t bk = kernel_config::block_k;
  if (it.ub >= it.ue) return 0;
  const index_t ntiles = (it.ue - it.ub + bk - 1) / bk;
  const index_t center =
      std::clamp<index_t>(it.qo + it.i0 + it.n / 2 - it.ko - it.ub, 0, it.ue - it.ub - 1) / bk;
  index_t skipped = 0;
  for (index_t t = center; t >= 0; --t) {
    if (skip.enabled() && t < center && skip.left(std::min(it.ue, it.ub + (t + 1) * bk))) {
      skipped += t + 1;
      break;
    }
    process(it.ub + t * bk);
  }
  for (index_t t = center + 1; t < ntiles; ++t) {
    if (skip.enabled() && skip.right(it.ub + t * bk)) {
      skipped += ntiles - t;
      break;
    }
    process(it.ub + t * bk);
  }
  return skipped;
}

/// Where an item's result goes: the output rows and logsumexp (final), or the unnormalized
/// partial output rows (dense (n, Dv)) and their softmax states, for merge_splits.
struct item_sink {
  tensor_view<float, 4> out;
  float* partial_o = nullptr;
  softmax_state* partial_state = nullptr;
  bool final_pass() const { return partial_o == nullptr; }
};

/// Writes the finished rows of an item.
inline void finish_rows(const item_rows& it, const workspace& ws, const cols_map& o,
                        const item_sink& sink) {
  const attention_problem& p = *it.p;
  const index_t dv = p.v_head_dim;
  if (!sink.final_pass()) {
    rows_map(sink.partial_o, it.n, dv, Eigen::OuterStride<>(dv)) = o;
    for (index_t r = 0; r < it.n; ++r) sink.partial_state[r] = ws.state[r];
    return;
  }
  for (index_t r = 0; r < it.n; ++r) {
    const softmax_state& st = ws.state[r];
    Eigen::Map<Eigen::RowVectorXf> orow(sink.out.ptr(it.b, it.h, it.i0 + r), dv);
    // A row with no allowed key (l = 0) gives 0, never 0/0; a NaN sum reaches the row.
    if (st.l > 0.0f || st.l != st.l)
      orow = o.row(r) / st.l;
    else
      orow.setZero();
    if (p.lse.data)
      p.lse(it.b, it.h, it.i0 + r) = st.lse(-it.slope * static_cast<float>(ws.shift[r]));
  }
}

/// The rows [i0, i1) of query head h of batch b against keys [kb, ke), into `sink`.
inline void attend_rows(const attention_problem& p, const tensor_view<const float, 4>& q,
                        const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
                        const item_sink& sink, index_t b, index_t h, index_t i0, index_t i1,
                        index_t kb, index_t ke, key_norms norms, bool careful = false) {
  const index_t lq = p.len_q(b), dv = p.v_head_dim;
  // Padded query rows produce zeros and logsumexp -inf.
  if (sink.final_pass())
    for (index_t i = std::max(i0, lq); i < i1; ++i) {
      std::fill(sink.out.ptr(b, h, i), sink.out.ptr(b, h, i) + dv, 0.0f);
      if (p.lse.data) p.lse(b, h, i) = -std::numeric_limits<float>::infinity();
    }
  const index_t n = std::min(i1, lq) - i0;
  if (n <= 0) return;

  workspace& ws = thread_workspace();
  ws.reserve(dv);
  const item_rows it = prepare_rows(p, b, h, i0, n, kb, ke, ws);
  const index_t ldo = padded_stride(workspace::rows);
  cols_map o(ws.o.data(), n, dv, Eigen::OuterStride<>(ldo));  // (n, Dv) column-major
  o.setZero();
  const_rows_map qm(q.ptr(b, h, i0), n, p.head_dim, Eigen::OuterStride<>(q.strides[2]));  // (n, D)
  const far_tile_skipper skip(it, qm, norms, ws);
  index_t tiles_done = 0;
  const index_t tiles_skipped = visit_tiles(it, skip, [&](index_t j0) {
    score_tile_view tile;
    if (!compute_score_tile(it, qm, k, v, j0, careful, ws, tile)) return;
    ++tiles_done;
    accumulate_tile(it, tile, v, ws, o);
  });
  if (p.stats && !careful) add_stats(p.stats, tiles_done, tiles_skipped);

  // P V through a GEMM multiplies masked probabilities (exact zeros) by every V row of the
  // tile, so a non-finite V row would reach rows that never attend to it (0 * NaN = NaN).
  // Checking every tile costs ~6%; instead a non-finite result, which finite inputs never
  // produce, sends the whole item through the careful path that keeps such rows out of
  // the GEMM and adds their contribution only where the probability is non-zero.
  if (!careful && !all_finite(o.data(), ldo, dv, n)) {
    attend_rows(p, q, k, v, sink, b, h, i0, i1, kb, ke, norms, true);
    return;
  }
  finish_rows(it, ws, o, sink);
}

/// Merges the partial results of the key chunks of rows [i0, i1) in chunk order.
inline void merge_splits(const attention_problem& p, const tensor_view<float, 4>& out, index_t b,
                         index_t h, index_t i0, index_t i1, index_t splits, const float* part_o,
                         const softmax_state* part_state, index_t rows_stride) {
  const index_t dv = p.v_head_dim;
  const index_t n = std::min(i1, p.len_q(b)) - i0;
  for (index_t r = 0; r < n; ++r) {
    Eigen::Map<Eigen::RowVectorXf> orow(out.ptr(b, h, i0 + r), dv);
    orow.setZero();
    softmax_state total;
    for (index_t c = 0; c < splits; ++c) {
      const softmax_state st = part_state[c * rows_stride + r];
      if (st.m == neg_inf_f()) continue;  // a chunk without keys adds nothing
      const softmax_merge mg = merge_states(total, st);
      total = mg.state;
      orow = orow * mg.wa +
             mg.wb * Eigen::Map<const Eigen::RowVectorXf>(part_o + (c * rows_stride + r) * dv, dv);
    }
    if (total.l > 0.0f || total.l != total.l) orow /= total.l;
    if (p.lse.data)
      p.lse(b, h, i0 + r) =
          total.lse(-p.slope(b, h) * static_cast<float>(p.distance_shift(b, i0 + r)));
  }
}

/// Key-norm bounds for far-tile skipping: one pass over K (B * Hkv * Lk * D), small next to
/// the attention itself. Keys past the length or excluded by the key mask are unused memory
/// and are not read. prefix and suffix: (B, Hkv, grid) each.
inline void compute_key_norms(int threads, const attention_problem& p,
                              const tensor_view<const float, 4>& k, index_t grid, float* prefix,
                              float* suffix) {
  constexpr index_t bk = kernel_config::block_k;
  parallel_for(threads, p.batch * p.kv_heads, [&](index_t bh) {
    const index_t b = bh / p.kv_heads, hk = bh % p.kv_heads, lq = p.len_q(b);
    float* pre = prefix + bh * grid;
    float* suf = suffix + bh * grid;
    // Only keys some row can reach: the rows' key ranges are monotone, so their union is
    // [range of row 0).begin, (range of the last row).end).
    const index_t lo = lq > 0 ? p.key_range(b, 0).begin : 0;
    const index_t hi = lq > 0 ? p.key_range(b, lq - 1).end : 0;
    for (index_t t = 0; t < grid; ++t) {
      float worst = 0.0f;
      for (index_t j = std::max(lo, t * bk); j < std::min(hi, (t + 1) * bk); ++j) {
        if (p.key_excluded(b, j)) continue;
        const float sq =
            Eigen::Map<const Eigen::RowVectorXf>(k.ptr(b, hk, j), p.head_dim).squaredNorm();
        worst = max_keep_nan(worst, sq);  // NaN disables skipping
      }
      // Rounded up: the bound must never fall below a true norm. A float sum of D squares
      // is within D * 2^-24 (relative) of the exact one; the margin covers that and sqrt.
      pre[t] = suf[t] =
          std::sqrt(worst * (1.0f + 1e-5f + static_cast<float>(p.head_dim) * 1.2e-7f));
    }
    for (index_t t = 1; t < grid; ++t) pre[t] = max_keep_nan(pre[t - 1], pre[t]);
    for (index_t t = grid - 2; t >= 0; --t) suf[t] = max_keep_nan(suf[t + 1], suf[t]);
  });
}

/// The work items of a call: (batch, head, query tile), the largest (last under a causal
/// mask) first, each optionally split into key chunks.
struct work_plan {
  index_t tiles = 0, heads = 0, items = 0, splits = 1, chunk = 0, rows_stride = 0;
  index_t q_heads = 0, q_len = 0;

  static work_plan make(const attention_problem& p) {
    using cfg = kernel_config;
    work_plan w;
    w.q_heads = p.q_heads;
    w.q_len = p.q_len;
    w.tiles = (p.q_len + cfg::block_q - 1) / cfg::block_q;
    w.heads = p.batch * p.q_heads;
    w.items = w.heads * w.tiles;
    if (w.items < cfg::min_items && p.k_len >= 2 * cfg::min_split_keys)
      w.splits = std::min((cfg::min_items + w.items - 1) / w.items, p.k_len / cfg::min_split_keys);
    // Split keys: chunk c covers keys [c * chunk, (c + 1) * chunk).
    w.chunk =
        ((p.k_len + w.splits - 1) / w.splits + cfg::block_k - 1) / cfg::block_k * cfg::block_k;
    w.rows_stride = std::min(cfg::block_q, p.q_len);
    return w;
  }
  /// Item -> (b, h, query rows [i0, i1)). Causal and windowed work grows with the query
  /// tile index, so the largest items go first: the atomic counter then balances the tail.
  void coords(index_t item, index_t& b, index_t& h, index_t& i0, index_t& i1) const {
    const index_t bh = item % heads, t = tiles - 1 - item / heads;
    b = bh / q_heads;
    h = bh % q_heads;
    i0 = t * kernel_config::block_q;
    i1 = std::min(q_len, i0 + kernel_config::block_q);
  }
};

inline void run(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
                const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
                const tensor_view<float, 4>& out) {
  if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0) return;
  const work_plan plan = work_plan::make(p);
  const int nthreads = resolve_threads(threads);

  const index_t grid = (p.k_len + kernel_config::block_k - 1) / kernel_config::block_k;
  // The calling thread's buffers, named by reference: a thread_local named inside the
  // lambdas would be each worker's own instance.
  thread_local aligned_buffer<float> prefix_buf, suffix_buf, part_o_buf;
  thread_local aligned_buffer<softmax_state> part_state_buf;
  const bool skipping = p.skip_far_tiles && p.slopes.enabled && grid > 1;
  if (skipping) {
    const auto size = static_cast<std::size_t>(p.batch * p.kv_heads * grid);
    prefix_buf.reserve(size);
    suffix_buf.reserve(size);
    compute_key_norms(nthreads, p, k, grid, prefix_buf.data(), suffix_buf.data());
  }
  const float* prefix = prefix_buf.data();
  const float* suffix = suffix_buf.data();
  auto norms_for = [&](index_t b, index_t h) {
    key_norms kn;
    if (skipping) {
      const index_t bh = b * p.kv_heads + p.kv_head(h);
      kn.prefix = prefix + bh * grid;
      kn.suffix = suffix + bh * grid;
    }
    return kn;
  };

  if (plan.splits == 1) {
    parallel_for(nthreads, plan.items, [&](index_t item) {
      index_t b, h, i0, i1;
      plan.coords(item, b, h, i0, i1);
      attend_rows(p, q, k, v, item_sink{out}, b, h, i0, i1, 0, p.k_len, norms_for(b, h));
    });
    return;
  }
  const index_t dv = p.v_head_dim, slots = plan.items * plan.splits;
  part_o_buf.reserve(static_cast<std::size_t>(slots * plan.rows_stride * dv));
  part_state_buf.reserve(static_cast<std::size_t>(slots * plan.rows_stride));
  float* part_o = part_o_buf.data();
  softmax_state* part_state = part_state_buf.data();
  parallel_for(nthreads, slots, [&](index_t work) {
    const index_t item = work / plan.splits, c = work % plan.splits;
    index_t b, h, i0, i1;
    plan.coords(item, b, h, i0, i1);
    const item_sink sink{out, part_o + work * plan.rows_stride * dv,
                         part_state + work * plan.rows_stride};
    // Rows of a chunk without keys keep the empty state (merge_splits skips them).
    for (index_t r = 0; r < i1 - i0; ++r) sink.partial_state[r] = softmax_state{};
    attend_rows(p, q, k, v, sink, b, h, i0, i1, c * plan.chunk,
                std::min(p.k_len, (c + 1) * plan.chunk), norms_for(b, h));
  });
  parallel_for(nthreads, plan.items, [&](index_t item) {
    index_t b, h, i0, i1;
    plan.coords(item, b, h, i0, i1);
    // Padded rows of the tile: zeros and -inf, as in the unsplit path.
    for (index_t i = std::max(i0, p.len_q(b)); i < i1; ++i) {
      std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + dv, 0.0f);
      if (p.lse.data) p.lse(b, h, i) = -std::numeric_limits<float>::infinity();
    }
    const index_t slot = item * plan.splits;
    merge_splits(p, out, b, h, i0, i1, plan.splits, part_o + slot * plan.rows_stride * dv,
                 part_state + slot * plan.rows_stride, plan.rows_stride);
  });
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

template <>
struct attention_impl<backend::eigen> {
  template <class TQ, class TKV, class TO, class Isa>
  static status can_implement(const backend::eigen&, const attention_problem&,
                              const attention_tensors<TQ, TKV, TO, Isa>&) {
    if (!std::is_same<TQ, float>::value || !std::is_same<TKV, float>::value ||
        !std::is_same<TO, float>::value)
      return status::failure(
          "alibi::attention (eigen): q, k, v and out must be float (use alibi::backend::reference "
          "for double)");
    return {};
  }

  template <class TQ, class TKV, class TO, class Isa>
  static void run(const backend::eigen& be, const attention_problem& p,
                  const attention_tensors<TQ, TKV, TO, Isa>& t) {
    if constexpr (std::is_same<TQ, float>::value && std::is_same<TKV, float>::value &&
                  std::is_same<TO, float>::value)
      cpu::run(be.threads, p, t.q, t.k, t.v, t.out);
  }

  template <class T>
  static void merge(const backend::eigen& be, const partial_merge_args<T>& a) {
    parallel_for(resolve_threads(be.threads), a.out.extents[0] * a.out.extents[1],
                 [&](index_t bh) { merge_head_rows(a, bh); });
  }
};

}  // namespace detail
}  // namespace alibi
