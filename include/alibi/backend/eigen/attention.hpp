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
#include <vector>

#include <Eigen/Core>

#include "alibi/attention.hpp"
#include "alibi/backend/eigen/parallel.hpp"
#include "alibi/backend/eigen/simd.hpp"
#include "alibi/detail/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace cpu {

/// Tile sizes and work-splitting constants of the fused CPU kernel.
struct kernel_config {
  static constexpr index_t block_q = 512;  // query rows per work item
  static constexpr index_t block_k = 128;  // keys per inner tile
  // Few (batch, head, query tile) items (decoding: q_len 1..16) leave threads idle, so the
  // keys are then split into chunks whose partial results are merged through their
  // logsumexp. The split depends on the shape only, never on the thread count, so results
  // stay bitwise independent of the thread count.
  static constexpr index_t min_items = 16;
  static constexpr index_t min_split_keys = 2048;
  static_assert(min_split_keys % block_k == 0, "key chunks must hold whole key tiles");
};

using row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using col_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using const_rows_map = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using rows_map = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using cols_map = Eigen::Map<col_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Leading dimensions of the scratch matrices, in floats: a multiple of 16 (64 bytes).
inline index_t padded_stride(index_t n) { return (n + 15) / 16 * 16; }

/// Per-thread scratch, grown on demand and reused across calls. Why aligned, with padded
/// leading dimensions: Eigen picks its packet peeling from pointer alignment, which would
/// change the summation order, and so the last bits, from one thread's buffers to another's;
/// with every buffer 64-byte aligned every thread computes in the same order.
struct workspace {
  template <class T>
  using aligned_vector = std::vector<T, Eigen::aligned_allocator<T>>;
  static constexpr index_t rows = kernel_config::block_q + 16;  // room for packet padding
  aligned_vector<float> s;  // (rows, block_k) column-major: scores, then probabilities
  aligned_vector<float> o;  // (rows, Dv) column-major: unnormalized output
  aligned_vector<float> v;  // (block_k, padded Dv) a V tile with unusable rows zeroed
  // Per query row of the item (rows):
  aligned_vector<float> base, shift_f, m_run, l_run, mx, m_use, alpha, lsum, qnorm;
  std::vector<index_t> shift, begin, end;
  // Per key of the tile (block_k): valid local rows [c0, c1).
  std::vector<index_t> c0, c1;
  std::vector<index_t> bad;  // keys of the tile whose V row stays out of the GEMM

  void reserve(index_t dv) {
    const auto r = static_cast<std::size_t>(rows);
    const auto bk = static_cast<std::size_t>(kernel_config::block_k);
    // At least one padded row even for v_head_dim 0, so that no map is built on null.
    const auto d = static_cast<std::size_t>(padded_stride(std::max<index_t>(dv, 1)));
    if (s.size() < r * bk) s.resize(r * bk);
    if (o.size() < r * d) o.resize(r * d);
    if (v.size() < bk * d) v.resize(bk * d);
    for (auto* a : {&base, &shift_f, &m_run, &l_run, &mx, &m_use, &alpha, &lsum, &qnorm})
      if (a->size() < r) a->assign(r, 0.0f);
    for (auto* a : {&shift, &begin, &end})
      if (a->size() < r) a->resize(r);
    if (c0.size() < bk) c0.resize(bk);
    if (c1.size() < bk) c1.resize(bk);
    bad.reserve(bk);
  }
};

inline workspace& thread_workspace() {
  thread_local workspace w;
  return w;
}

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

/// Adds one work item's counts to the caller's counters.
inline void add_stats(attention_stats* stats, index_t computed, index_t skipped) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  stats->tiles_computed += computed;
  stats->tiles_skipped += skipped;
}

/// Upper bounds on key norms for the far-tile bound: for one (batch, kv head), over the key
/// grid tiles [t * block_k, (t + 1) * block_k), prefix[t] = max |k_j| for j < (t + 1) *
/// block_k and suffix[t] = max |k_j| for j >= t * block_k. Null when skipping is off.
struct key_norms {
  const float* prefix = nullptr;
  const float* suffix = nullptr;
};

/// Natural log of the far-tile threshold: the skipped weight stays below 2^-25 of the
/// row's running normalizer, so the output moves by less than 2^-24 max|v| (half an fp32
/// ulp of a unit output) even counting the bound's own fp32 slack.
constexpr double skip_log_epsilon = -25 * 0.69314718055994531;

/// The rows [i0, i1) of query head h of batch b against keys [kb, ke). Without `partial_o`
/// it writes out and logsumexp; with it, the unnormalized partial output rows (dense
/// (i1 - i0, Dv)) and their softmax state, for merge_splits.
inline void attend_tile(const attention_problem& p, const tensor_view<const float, 4>& q,
                        const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
                        const tensor_view<float, 4>& out, index_t b, index_t h, index_t i0,
                        index_t i1, index_t kb, index_t ke, float* partial_o,
                        softmax_state* partial_state, key_norms norms, bool careful = false) {
  using cfg = kernel_config;
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  const index_t lq = p.len_q(b), dv = p.v_head_dim, d = p.head_dim, hk = p.kv_head(h);
  const bool final_pass = partial_o == nullptr;
  // Padded query rows produce zeros and logsumexp -inf.
  if (final_pass)
    for (index_t i = std::max(i0, lq); i < i1; ++i) {
      std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + dv, 0.0f);
      if (p.lse.data) p.lse(b, h, i) = neg_inf;
    }
  const index_t n = std::min(i1, lq) - i0;
  if (n <= 0) return;

  workspace& ws = thread_workspace();
  ws.reserve(dv);
  const index_t qo = p.q_offset(b), ko = p.k_offset(b);
  index_t ub = ke, ue = kb;  // union of the rows' key ranges
  for (index_t r = 0; r < n; ++r) {
    const index_range kr = p.key_range(b, i0 + r);
    // Positional key ranges are monotone in the row (both ends non-decreasing), which makes
    // the valid rows of every key column contiguous.
    ws.begin[r] = std::clamp(kr.begin, kb, ke);
    ws.end[r] = std::clamp(kr.end, ws.begin[r], ke);
    ws.shift[r] = p.distance_shift(b, i0 + r);
    ws.shift_f[r] = static_cast<float>(ws.shift[r]);
    ws.m_run[r] = neg_inf;
    ws.l_run[r] = 0.0f;
    if (ws.begin[r] < ws.end[r]) {
      ub = std::min(ub, ws.begin[r]);
      ue = std::max(ue, ws.end[r]);
    }
  }
  const index_t ldo = padded_stride(workspace::rows);
  cols_map o(ws.o.data(), n, dv, Eigen::OuterStride<>(ldo));  // (n, Dv) column-major
  o.setZero();
  const float slope = p.slope(b, h);
  const float neg_slope = -slope;
  const bool* key_mask_row = p.key_mask.data ? p.key_mask.ptr(b) : nullptr;

  const_rows_map qm(q.ptr(b, h, i0), n, d, Eigen::OuterStride<>(q.strides[2]));  // (n, D)
  const bool skipping = norms.prefix != nullptr && slope > 0.0f && std::isfinite(slope);
  if (skipping)
    for (index_t r = 0; r < n; ++r)
      ws.qnorm[r] = static_cast<float>(qm.row(r).cast<double>().norm() * (1 + 1e-6));
  // Far-tile bound (ALiBi-specific). Every score of row r against a key at distance dist
  // is at most c_r - slope * (dist - shift_r), with c_r = |scale| |q_r| max|k| (Cauchy-
  // Schwarz). Remaining keys on one side of the row, nearest at distance dn >= 0, have
  // distinct distances dn, dn + 1, ..., so their total weight exp(score - m_r) is at most
  // exp(c_r - slope (dn - shift_r) - m_r) / (1 - exp(-slope)). When that is below
  // 2^-25 l_r (l_r: the row's running normalizer relative to its running max m_r, a lower
  // bound on the final one) for every row, the remaining tiles on that side are skipped.
  const double log_geo = -std::log(-std::expm1(-static_cast<double>(slope)));
  auto negligible = [&](index_t r, index_t dn, float kmax) {
    const double m = ws.m_run[r], l = ws.l_run[r];
    if (!(l > 0.0) || !std::isfinite(m)) return false;
    const double c = std::fabs(static_cast<double>(p.scale)) * ws.qnorm[r] * kmax;
    const double log_bound = c - slope * static_cast<double>(dn - ws.shift[r]) + log_geo - m;
    return log_bound <= skip_log_epsilon + std::log(l);  // false for NaN
  };
  // Keys [ub, x) remain on the left.
  auto skip_left = [&](index_t x) {
    const float kmax = norms.prefix[(x - 1) / cfg::block_k];
    for (index_t r = 0; r < n; ++r) {
      const index_t last = std::min(x, ws.end[r]) - 1;
      if (last < ws.begin[r]) continue;  // the row has no key there
      const index_t dn = qo + i0 + r - (ko + last);
      if (dn < 0 || !negligible(r, dn, kmax)) return false;
    }
    return true;
  };
  // Keys [x, ue) remain on the right.
  auto skip_right = [&](index_t x) {
    const float kmax = norms.suffix[x / cfg::block_k];
    for (index_t r = 0; r < n; ++r) {
      const index_t first = std::max(x, ws.begin[r]);
      if (first >= ws.end[r]) continue;
      const index_t dn = ko + first - (qo + i0 + r);
      if (dn < 0 || !negligible(r, dn, kmax)) return false;
    }
    return true;
  };
  index_t tiles_done = 0;
  auto process_tile = [&](index_t j0) {
    const index_t bk = std::min(cfg::block_k, ue - j0);
    // Only the rows whose key range meets this tile take part (causal and windowed tiles
    // on the diagonal band need a fraction of the rows).
    index_t ra = n, rb = 0;
    for (index_t r = 0; r < n; ++r)
      if (ws.begin[r] < j0 + bk && ws.end[r] > j0 && ws.begin[r] < ws.end[r]) {
        ra = std::min(ra, r);
        rb = r + 1;
      }
    if (ra >= rb) return;
    ++tiles_done;
    const index_t m = rb - ra, mp = packet_rows(m);
    const_rows_map km(k.ptr(b, hk, j0), bk, d, Eigen::OuterStride<>(k.strides[2]));   // (bk, D)
    const_rows_map vm(v.ptr(b, hk, j0), bk, dv, Eigen::OuterStride<>(v.strides[2]));  // (bk, Dv)

    // Valid local rows of each key column; keys the key mask excludes get none.
    ws.bad.clear();
    bool any_excluded = false;
    for (index_t j = 0, lo = 0, hi = 0; j < bk; ++j) {
      const index_t key = j0 + j;
      while (lo < m && ws.end[ra + lo] <= key) ++lo;
      while (hi < m && ws.begin[ra + hi] <= key) ++hi;
      const bool excluded = key_mask_row && p.key_excluded(b, key);
      any_excluded |= excluded;
      ws.c0[j] = lo;
      ws.c1[j] = excluded ? lo : std::max(lo, hi);
      // Excluded keys are unused memory (they may hold NaN): their V rows stay out of P V.
      if (excluded || (careful && !all_finite(vm.row(j).data(), 0, 1, dv))) ws.bad.push_back(j);
    }
    for (index_t t = 0; t < mp; ++t)
      ws.base[ra + t] = t < m ? static_cast<float>(qo + i0 + ra + t - (ko + j0)) : 0.0f;
    tile_geometry g;
    g.rows = m;
    g.cols = bk;
    g.base = ws.base.data() + ra;
    g.shift = ws.shift_f.data() + ra;
    g.c0 = ws.c0.data();
    g.c1 = ws.c1.data();
    // Exact float distances need every |q_pos - k_pos| - shift of the tile below 2^24.
    const index_t dmax = std::max(std::abs(qo + i0 + ra - (ko + j0 + bk - 1)),
                                  std::abs(qo + i0 + rb - 1 - (ko + j0)));
    const bool near = dmax < (index_t(1) << 24);
    float* mx = ws.mx.data() + ra;

    // The score tile is column-major (passes vectorized across query rows) unless it has
    // fewer rows than a packet (decoding), where it is row-major and vectorized across keys.
    const bool by_rows = m < lanes;
    const index_t lds = by_rows ? padded_stride(cfg::block_k) : padded_stride(workspace::rows);
    auto tile = [&](auto s) {  // s: (m, bk) scores of rows ra..rb, in either layout
      s.noalias() = qm.middleRows(ra, m) * km.transpose();
      if (!near) {
        score_tile_far(s.data(), by_rows ? lds : 1, by_rows ? 1 : lds, g, p.scale, slope,
                       qo + i0 + ra, ko + j0, ws.shift.data() + ra, mx);
      } else if (!by_rows) {
        score_tile(s.data(), lds, g, p.scale, neg_slope, mx);
      } else {
        for (index_t t = 0; t < m; ++t) {
          float* x = s.data() + t * lds;
          const index_t r = ra + t;
          mx[t] = score_row(x, bk, std::clamp<index_t>(ws.begin[r] - j0, 0, bk),
                            std::clamp<index_t>(ws.end[r] - j0, 0, bk), p.scale, neg_slope,
                            ws.base[r], ws.shift_f[r]);
          if (any_excluded) {
            mx[t] = -std::numeric_limits<float>::infinity();
            for (index_t j = 0; j < bk; ++j) {
              if (ws.c0[j] == ws.c1[j]) x[j] = neg_inf;
              mx[t] = (x[j] > mx[t] || x[j] != x[j]) ? x[j] : mx[t];
            }
          }
        }
      }

      // Online softmax update of each row: new maximum, rescale factor, probabilities.
      bool rescale = false;
      for (index_t t = 0; t < mp; ++t) {
        if (t >= m) {
          ws.m_use[ra + t] = 0.0f;  // padding rows: exp(-inf - 0) = 0
          continue;
        }
        const index_t r = ra + t;
        const float m_old = ws.m_run[r];
        // NaN scores must reach the output (E17): a NaN maximum is kept, never replaced.
        const float m_new = (mx[t] > m_old || mx[t] != mx[t]) ? mx[t] : m_old;
        // A row with every score so far masked uses 0 as its reference: exp(-inf - 0) = 0.
        ws.m_use[r] = m_new == neg_inf ? 0.0f : m_new;
        ws.alpha[r] = rescale_factor(m_old, m_new);
        rescale |= ws.alpha[r] != 1.0f;
        ws.m_run[r] = m_new;
      }
      if (by_rows)
        for (index_t t = 0; t < m; ++t)
          ws.lsum[ra + t] = exp_row(s.data() + t * lds, bk, ws.m_use[ra + t]);
      else
        exp_tile(s.data(), lds, m, bk, ws.m_use.data() + ra, ws.lsum.data() + ra);
      for (index_t r = ra; r < rb; ++r) ws.l_run[r] = ws.l_run[r] * ws.alpha[r] + ws.lsum[r];

      auto o_act = o.middleRows(ra, m);  // (m, Dv)
      if (rescale)
        o_act.array().colwise() *= Eigen::Map<const Eigen::ArrayXf>(ws.alpha.data() + ra, m);
      if (ws.bad.empty()) {
        o_act.noalias() += s * vm;
      } else {
        rows_map vc(ws.v.data(), bk, dv, Eigen::OuterStride<>(padded_stride(dv)));
        vc = vm;
        for (index_t j : ws.bad) vc.row(j).setZero();
        o_act.noalias() += s * vc;
        // A non-finite V row still reaches exactly the rows that attend to it, even where
        // its weight rounded to 0 (0 * NaN = NaN, as the mathematics has it).
        for (index_t j : ws.bad)
          for (index_t t = ws.c0[j]; t < ws.c1[j]; ++t) o_act.row(t) += s(t, j) * vm.row(j);
      }
    };
    if (by_rows)
      tile(rows_map(ws.s.data(), m, bk, Eigen::OuterStride<>(lds)));
    else
      tile(cols_map(ws.s.data(), m, bk, Eigen::OuterStride<>(lds)));
  };

  // Key tiles nearest-first: the tile holding the key nearest the middle row, then outward
  // to the left, then to the right, so that the running maxima are good before the bound
  // is consulted.
  index_t tiles_skipped = 0;
  if (ub < ue) {
    const index_t ntiles = (ue - ub + cfg::block_k - 1) / cfg::block_k;
    const index_t center =
        std::clamp<index_t>(qo + i0 + n / 2 - ko - ub, 0, ue - ub - 1) / cfg::block_k;
    for (index_t t = center; t >= 0; --t) {
      if (skipping && t < center && skip_left(std::min(ue, ub + (t + 1) * cfg::block_k))) {
        tiles_skipped += t + 1;
        break;
      }
      process_tile(ub + t * cfg::block_k);
    }
    for (index_t t = center + 1; t < ntiles; ++t) {
      if (skipping && skip_right(ub + t * cfg::block_k)) {
        tiles_skipped += ntiles - t;
        break;
      }
      process_tile(ub + t * cfg::block_k);
    }
  }
  if (p.stats && !careful) add_stats(p.stats, tiles_done, tiles_skipped);

  // P V through a GEMM multiplies masked probabilities (exact zeros) by every V row of the
  // tile, so a non-finite V row would reach rows that never attend to it (0 * NaN = NaN).
  // Checking every tile costs ~6%; instead a non-finite result, which finite inputs never
  // produce, sends the whole item through the careful path that keeps such rows out of
  // the GEMM and adds their contribution only where the probability is non-zero.
  if (!careful && !all_finite(o.data(), ldo, dv, n)) {
    attend_tile(p, q, k, v, out, b, h, i0, i1, kb, ke, partial_o, partial_state, norms, true);
    return;
  }
  if (!final_pass) {
    rows_map(partial_o, n, dv, Eigen::OuterStride<>(dv)) = o;
    for (index_t r = 0; r < n; ++r) partial_state[r] = softmax_state{ws.m_run[r], ws.l_run[r]};
    return;
  }
  for (index_t r = 0; r < n; ++r) {
    const softmax_state st{ws.m_run[r], ws.l_run[r]};
    Eigen::Map<Eigen::RowVectorXf> orow(out.ptr(b, h, i0 + r), dv);
    // A row with no allowed key (l = 0) gives 0, never 0/0.
    if (st.l > 0.0f || st.l != st.l)
      orow = o.row(r) / st.l;
    else
      orow.setZero();
    if (p.lse.data)
      p.lse(b, h, i0 + r) = finish_lse(st) + neg_slope * static_cast<float>(ws.shift[r]);
  }
}

/// Merges the partial results of the key chunks of rows [i0, i1) in chunk order.
inline void merge_splits(const attention_problem& p, const tensor_view<float, 4>& out, index_t b,
                         index_t h, index_t i0, index_t i1, index_t splits, const float* part_o,
                         const softmax_state* part_state, index_t rows_stride) {
  const index_t dv = p.v_head_dim;
  const index_t n = std::min(i1, p.len_q(b)) - i0;
  for (index_t r = 0; r < n; ++r) {
    softmax_state total;
    for (index_t c = 0; c < splits; ++c) {
      const softmax_state st = part_state[c * rows_stride + r];
      if (st.m > total.m || st.m != st.m) total.m = st.m;
    }
    Eigen::Map<Eigen::RowVectorXf> orow(out.ptr(b, h, i0 + r), dv);
    orow.setZero();
    if (total.m == -std::numeric_limits<float>::infinity()) {
      if (p.lse.data) p.lse(b, h, i0 + r) = finish_lse(total);
      continue;
    }
    for (index_t c = 0; c < splits; ++c) {
      const softmax_state st = part_state[c * rows_stride + r];
      if (st.m == -std::numeric_limits<float>::infinity()) continue;
      const float w = exp_flush(st.m - total.m);
      total.l += st.l * w;
      orow += w * Eigen::Map<const Eigen::RowVectorXf>(part_o + (c * rows_stride + r) * dv, dv);
    }
    orow /= total.l;
    if (p.lse.data)
      p.lse(b, h, i0 + r) =
          finish_lse(total) - p.slope(b, h) * static_cast<float>(p.distance_shift(b, i0 + r));
  }
}

inline void run(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
                const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
                const tensor_view<float, 4>& out) {
  using cfg = kernel_config;
  if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0) return;
  const index_t tiles = (p.q_len + cfg::block_q - 1) / cfg::block_q;
  const index_t heads = p.batch * p.q_heads;
  const index_t items = heads * tiles;
  index_t splits = 1;
  if (items < cfg::min_items && p.k_len >= 2 * cfg::min_split_keys) {
    splits = std::min((cfg::min_items + items - 1) / items, p.k_len / cfg::min_split_keys);
  }
  // Causal and windowed work grows with the query tile index, so the largest items go
  // first: the atomic counter then balances the tail.
  auto item_coords = [&](index_t item, index_t& b, index_t& h, index_t& t) {
    const index_t bh = item % heads;
    t = tiles - 1 - item / heads;
    b = bh / p.q_heads;
    h = bh % p.q_heads;
  };
  const int nthreads = resolve_threads(threads);

  // Key-norm bounds for far-tile skipping: one pass over K (B * Hkv * Lk * D), small next
  // to the attention itself. Keys past the length or excluded by the key mask are unused
  // memory and are not read.
  const index_t grid = (p.k_len + cfg::block_k - 1) / cfg::block_k;
  thread_local std::vector<float> prefix_buf, suffix_buf;  // (B, Hkv, grid) each
  std::vector<float>& prefix = prefix_buf;
  std::vector<float>& suffix = suffix_buf;
  const bool skipping = p.skip_far_tiles && p.slopes.enabled && grid > 1;
  if (skipping) {
    prefix.assign(static_cast<std::size_t>(p.batch * p.kv_heads * grid), 0.0f);
    suffix.assign(prefix.size(), 0.0f);
    parallel_for(nthreads, p.batch * p.kv_heads, [&](index_t bh) {
      const index_t b = bh / p.kv_heads, hk = bh % p.kv_heads, lq = p.len_q(b);
      float* pre = prefix.data() + bh * grid;
      float* suf = suffix.data() + bh * grid;
      // Only keys some row can reach: the rows' key ranges are monotone, so their union is
      // [range of row 0).begin, (range of the last row).end).
      const index_t lo = lq > 0 ? p.key_range(b, 0).begin : 0;
      const index_t hi = lq > 0 ? p.key_range(b, lq - 1).end : 0;
      for (index_t t = 0; t < grid; ++t) {
        float worst = 0.0f;
        for (index_t j = std::max(lo, t * cfg::block_k); j < std::min(hi, (t + 1) * cfg::block_k);
             ++j) {
          if (p.key_excluded(b, j)) continue;
          const float sq =
              Eigen::Map<const Eigen::RowVectorXf>(k.ptr(b, hk, j), p.head_dim).squaredNorm();
          worst = sq > worst || sq != sq ? sq : worst;  // NaN disables skipping
        }
        // Rounded up: the bound must never fall below a true norm. A float sum of D squares
        // is within D * 2^-24 (relative) of the exact one; the margin covers that and sqrt.
        pre[t] = suf[t] =
            std::sqrt(worst * (1.0f + 1e-5f + static_cast<float>(p.head_dim) * 1.2e-7f));
      }
      for (index_t t = 1; t < grid; ++t)
        pre[t] = pre[t] > pre[t - 1] || pre[t] != pre[t] ? pre[t] : pre[t - 1];
      for (index_t t = grid - 2; t >= 0; --t)
        suf[t] = suf[t] > suf[t + 1] || suf[t] != suf[t] ? suf[t] : suf[t + 1];
    });
  }
  auto norms_for = [&](index_t b, index_t h) {
    key_norms kn;
    if (skipping) {
      const index_t bh = b * p.kv_heads + p.kv_head(h);
      kn.prefix = prefix.data() + bh * grid;
      kn.suffix = suffix.data() + bh * grid;
    }
    return kn;
  };

  if (splits == 1) {
    parallel_for(nthreads, items, [&](index_t item) {
      index_t b, h, t;
      item_coords(item, b, h, t);
      const index_t i0 = t * cfg::block_q, i1 = std::min(p.q_len, i0 + cfg::block_q);
      attend_tile(p, q, k, v, out, b, h, i0, i1, 0, p.k_len, nullptr, nullptr, norms_for(b, h));
    });
    return;
  }
  // Split keys: chunk c covers keys [c * chunk, (c + 1) * chunk).
  const index_t chunk =
      ((p.k_len + splits - 1) / splits + cfg::block_k - 1) / cfg::block_k * cfg::block_k;
  const index_t rows_stride = std::min(cfg::block_q, p.q_len);
  const index_t dv = p.v_head_dim;
  // The calling thread's buffers, named by reference: a thread_local named inside the
  // lambdas would be each worker's own instance.
  thread_local std::vector<float> part_o_buf;
  thread_local std::vector<softmax_state> part_state_buf;
  std::vector<float>& part_o = part_o_buf;
  std::vector<softmax_state>& part_state = part_state_buf;
  part_o.assign(static_cast<std::size_t>(items * splits * rows_stride * dv), 0.0f);
  part_state.assign(static_cast<std::size_t>(items * splits * rows_stride), softmax_state{});
  parallel_for(nthreads, items * splits, [&](index_t work) {
    const index_t item = work / splits, c = work % splits;
    index_t b, h, t;
    item_coords(item, b, h, t);
    const index_t i0 = t * cfg::block_q, i1 = std::min(p.q_len, i0 + cfg::block_q);
    const index_t slot = item * splits + c;
    attend_tile(p, q, k, v, out, b, h, i0, i1, c * chunk, std::min(p.k_len, (c + 1) * chunk),
                part_o.data() + slot * rows_stride * dv, part_state.data() + slot * rows_stride,
                norms_for(b, h));
  });
  parallel_for(nthreads, items, [&](index_t item) {
    index_t b, h, t;
    item_coords(item, b, h, t);
    const index_t i0 = t * cfg::block_q, i1 = std::min(p.q_len, i0 + cfg::block_q);
    // Padded rows of the tile: zeros and -inf, as in the unsplit path.
    for (index_t i = std::max(i0, p.len_q(b)); i < i1; ++i) {
      std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + dv, 0.0f);
      if (p.lse.data) p.lse(b, h, i) = -std::numeric_limits<float>::infinity();
    }
    const index_t slot = item * splits;
    merge_splits(p, out, b, h, i0, i1, splits, part_o.data() + slot * rows_stride * dv,
                 part_state.data() + slot * rows_stride, rows_stride);
  });
}

}  // namespace cpu

template <>
struct attention_impl<backend::eigen> {
  template <class TQ, class TKV, class TO>
  static status can_implement(const backend::eigen&, const attention_problem&,
                              const attention_tensors<TQ, TKV, TO>&) {
    if (!std::is_same<TQ, float>::value || !std::is_same<TKV, float>::value ||
        !std::is_same<TO, float>::value)
      return status::failure(
          "alibi::attention (eigen): q, k, v and out must be float (use alibi::backend::reference "
          "for double)");
    return {};
  }

  template <class TQ, class TKV, class TO>
  static void run(const backend::eigen& be, const attention_problem& p,
                  const attention_tensors<TQ, TKV, TO>& t) {
    if constexpr (std::is_same<TQ, float>::value && std::is_same<TKV, float>::value &&
                  std::is_same<TO, float>::value)
      cpu::run(be.threads, p, t.q, t.k, t.v, t.out);
  }
};

}  // namespace detail
}  // namespace alibi
