// SPDX-License-Identifier: MIT
// alibi::backend::eigen: the fused CPU attention. Flash-attention style: per (batch, head,
// query tile) it streams key tiles, S = Q K^T through Eigen's GEMM, adds the ALiBi bias and
// the masks in one pass, keeps an online softmax (running max and sum) and accumulates
// O += P V through Eigen's GEMM. The L x L score or bias matrix never exists.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "alibi/attention.hpp"
#include "alibi/detail/cpu_parallel.hpp"
#include "alibi/detail/cpu_simd.hpp"
#include "alibi/detail/online_softmax.hpp"
#include "alibi/eigen.hpp"

namespace alibi {
namespace detail {
namespace cpu {

/// Tile sizes and work-splitting constants of the fused CPU kernel.
struct kernel_config {
  static constexpr index_t block_q = 256;  // query rows per work item
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
using const_rows_map = Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using rows_map = Eigen::Map<row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Row strides of the scratch matrices, in floats: a multiple of 16 (64 bytes).
inline index_t padded_stride(index_t n) { return (n + 15) / 16 * 16; }

/// Per-thread scratch, grown on demand and reused across calls. Why aligned, with padded
/// row strides: Eigen picks its packet peeling from pointer alignment, which would change
/// the summation order, and so the last bits, from one thread's buffers to another's; with
/// every buffer 64-byte aligned every thread sums in the same order.
struct workspace {
  template <class T>
  using aligned_vector = std::vector<T, Eigen::aligned_allocator<T>>;
  aligned_vector<float> s;           // (block_q, block_k) scores, then probabilities
  aligned_vector<float> o;           // (block_q, padded Dv) unnormalized output rows
  aligned_vector<float> v;           // (block_k, padded Dv) a V tile, unusable rows zeroed
  std::vector<softmax_state> state;  // (block_q)
  std::vector<index_range> keys;     // (block_q) allowed keys of each row
  std::vector<index_t> shift;        // (block_q) distance_shift of each row
  std::vector<index_t> bad;          // keys of the current tile that need special care

  void reserve(index_t dv) {
    const auto bq = static_cast<std::size_t>(kernel_config::block_q);
    const auto bk = static_cast<std::size_t>(kernel_config::block_k);
    const auto d = static_cast<std::size_t>(padded_stride(dv));
    if (s.size() < bq * bk) s.resize(bq * bk);
    if (o.size() < bq * d) o.resize(bq * d);
    if (v.size() < bk * d) v.resize(bk * d);
    if (state.size() < bq) state.resize(bq);
    if (keys.size() < bq) keys.resize(bq);
    if (shift.size() < bq) shift.resize(bq);
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

/// One softmax row of a tile: scores s[0, n) of the query at position q_pos against keys
/// from position k_pos0, keys [vb, ve) allowed by the positional masks, `excluded` (if not
/// null) marking keys the key mask removes. On return s holds the probabilities
/// exp(x - m_new), 0 for masked keys; returns the factor by which the row's accumulated
/// output must be rescaled.
ALIBI_FORCEINLINE float softmax_row(float* s, index_t n, index_t vb, index_t ve, float scale,
                                    float neg_slope, bool exact_bias, index_t shift, index_t q_pos,
                                    index_t k_pos0, const bool* excluded, softmax_state& st) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(s, s + vb, 0.0f);
  std::fill(s + std::max(vb, ve), s + n, 0.0f);
  if (vb >= ve) return 1.0f;
  float* x = s + vb;
  const index_t len = ve - vb;
  float mx;
  if (exact_bias) {
    // The distance of key vb, as an exact float (see kernel code for the 2^24 bound).
    mx = score_row(x, len, scale, neg_slope, static_cast<float>(q_pos - (k_pos0 + vb)),
                   static_cast<float>(shift));
  } else {
    mx = neg_inf;
    for (index_t j = 0; j < len; ++j) {
      x[j] = scale * x[j] + alibi_bias(-neg_slope, q_pos, k_pos0 + vb + j, shift);
      mx = (x[j] > mx || x[j] != x[j]) ? x[j] : mx;
    }
  }
  if (excluded) {
    mx = neg_inf;
    for (index_t j = 0; j < len; ++j) {
      if (excluded[vb + j]) x[j] = neg_inf;
      mx = (x[j] > mx || x[j] != x[j]) ? x[j] : mx;
    }
  }
  // NaN scores must reach the output (E17): a NaN maximum is kept, never replaced by m.
  const float m_new = (mx > st.m || mx != mx) ? mx : st.m;
  if (m_new == neg_inf) {  // everything masked so far: nothing to accumulate
    std::fill(x, x + len, 0.0f);
    return 1.0f;
  }
  const float alpha = rescale_factor(st.m, m_new);
  st.l = st.l * alpha + exp_row(x, len, m_new);
  st.m = m_new;
  return alpha;
}

/// The rows [i0, i1) of query head h of batch b against keys [kb, ke). final: writes out and
/// logsumexp. Otherwise writes the unnormalized partial output and state to `partial_o`
/// ((i1 - i0, Dv) rows) and `partial_state`.
inline void attend_tile(const attention_problem& p, const tensor_view<const float, 4>& q,
                        const tensor_view<const float, 4>& k, const tensor_view<const float, 4>& v,
                        const tensor_view<float, 4>& out, index_t b, index_t h, index_t i0,
                        index_t i1, index_t kb, index_t ke, float* partial_o,
                        softmax_state* partial_state, bool careful = false) {
  using cfg = kernel_config;
  const index_t lq = p.len_q(b), dv = p.v_head_dim, d = p.head_dim, hk = p.kv_head(h);
  const bool final_pass = partial_o == nullptr;
  // Padded query rows produce zeros and logsumexp -inf.
  if (final_pass)
    for (index_t i = std::max(i0, lq); i < i1; ++i) {
      std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + dv, 0.0f);
      if (p.lse.data) p.lse(b, h, i) = -std::numeric_limits<float>::infinity();
    }
  const index_t n = std::min(i1, lq) - i0;
  if (n <= 0) return;

  workspace& ws = thread_workspace();
  ws.reserve(dv);
  const index_t qo = p.q_offset(b), ko = p.k_offset(b);
  index_t ub = ke, ue = kb;  // union of the rows' key ranges
  for (index_t r = 0; r < n; ++r) {
    index_range kr = p.key_range(b, i0 + r);
    kr.begin = std::max(kr.begin, kb);
    kr.end = std::min(kr.end, ke);
    ws.keys[r] = kr;
    ws.shift[r] = p.distance_shift(b, i0 + r);
    ws.state[r] = softmax_state{};
    if (!kr.empty()) {
      ub = std::min(ub, kr.begin);
      ue = std::max(ue, kr.end);
    }
  }
  const index_t ldo = padded_stride(dv);
  rows_map o(ws.o.data(), n, dv, Eigen::OuterStride<>(ldo));  // (n, Dv)
  o.setZero();
  const float slope = p.slope(b, h);
  const float neg_slope = -slope;
  const bool* key_mask_row = p.key_mask.data ? p.key_mask.ptr(b) : nullptr;
  const bool key_mask_dense = key_mask_row == nullptr || p.key_mask.strides[1] == 1;
  std::vector<char> excluded_buf;  // only for a strided key mask (rare)

  const_rows_map qm(q.ptr(b, h, i0), n, d, Eigen::OuterStride<>(q.strides[2]));  // (n, D)
  for (index_t j0 = ub; j0 < ue; j0 += cfg::block_k) {
    const index_t bk = std::min(cfg::block_k, ue - j0);
    const_rows_map km(k.ptr(b, hk, j0), bk, d, Eigen::OuterStride<>(k.strides[2]));   // (bk, D)
    const_rows_map vm(v.ptr(b, hk, j0), bk, dv, Eigen::OuterStride<>(v.strides[2]));  // (bk, Dv)
    // Only the rows whose key range meets this tile take part (causal and windowed tiles
    // on the diagonal band need a fraction of the rows).
    index_t ra = n, rb = 0;
    for (index_t r = 0; r < n; ++r) {
      const index_range kr = ws.keys[r];
      if (kr.begin < j0 + bk && kr.end > j0 && !kr.empty()) {
        ra = std::min(ra, r);
        rb = r + 1;
      }
    }
    if (ra >= rb) continue;
    const index_t m = rb - ra;
    const index_t lds = padded_stride(bk);
    rows_map s(ws.s.data(), m, bk, Eigen::OuterStride<>(lds));  // (m, bk): rows ra..rb
    auto o_act = o.middleRows(ra, m);                           // (m, Dv)
    s.noalias() = qm.middleRows(ra, m) * km.transpose();

    // Keys excluded by the key mask, and keys whose V row is not finite: P V through a GEMM
    // would spread their NaN/Inf (0 * NaN = NaN) into rows that never attend to them.
    const bool* excluded = nullptr;
    if (key_mask_row) {
      if (key_mask_dense) {
        excluded = key_mask_row + j0;
      } else {
        excluded_buf.resize(static_cast<std::size_t>(bk));
        for (index_t j = 0; j < bk; ++j) excluded_buf[j] = p.key_excluded(b, j0 + j);
        excluded = reinterpret_cast<const bool*>(excluded_buf.data());
      }
    }
    // Keys whose V row must not enter the GEMM: excluded keys (unused memory, may hold
    // NaN) and, in careful mode, keys with a non-finite V row.
    ws.bad.clear();
    const bool v_finite = !careful || all_finite(vm.data(), v.strides[2], bk, dv);
    if (excluded || !v_finite)
      for (index_t j = 0; j < bk; ++j)
        if ((excluded && excluded[j]) || (!v_finite && !all_finite(vm.row(j).data(), 0, 1, dv)))
          ws.bad.push_back(j);

    // Exact float distances need every |q_pos - k_pos| of the tile below 2^24.
    const index_t dmax =
        std::max(std::abs(qo + i0 - (ko + j0 + bk - 1)), std::abs(qo + i0 + n - 1 - (ko + j0)));
    const bool exact_bias = dmax < (index_t(1) << 24);
    for (index_t r = ra; r < rb; ++r) {
      const index_range kr = ws.keys[r];
      const index_t vb = std::clamp<index_t>(kr.begin - j0, 0, bk);
      const index_t ve = std::clamp<index_t>(kr.end - j0, 0, bk);
      const index_t q_pos = qo + i0 + r, k_pos0 = ko + j0;
      const float alpha =
          softmax_row(ws.s.data() + (r - ra) * lds, bk, vb, ve, p.scale, neg_slope, exact_bias,
                      ws.shift[r], q_pos, k_pos0, excluded, ws.state[r]);
      if (alpha != 1.0f) o.row(r) *= alpha;
    }
    if (ws.bad.empty()) {
      o_act.noalias() += s * vm;
    } else {
      rows_map vc(ws.v.data(), bk, dv, Eigen::OuterStride<>(ldo));
      vc = vm;
      for (index_t j : ws.bad) vc.row(j).setZero();
      o_act.noalias() += s * vc;
      // A non-finite V row still reaches the rows that attend to it, exactly.
      for (index_t j : ws.bad)
        for (index_t r = 0; r < m; ++r)
          if (s(r, j) != 0.0f) o_act.row(r) += s(r, j) * vm.row(j);
    }
  }

  // P V through a GEMM multiplies masked probabilities (exact zeros) by every V row of the
  // tile, so a non-finite V row would reach rows that never attend to it (0 * NaN = NaN).
  // Checking every tile costs ~6%; instead a non-finite result, which finite inputs never
  // produce, sends the whole item through the careful path that keeps such rows out of
  // the GEMM and adds their contribution only where the probability is non-zero.
  if (!careful && !all_finite(o.data(), ldo, n, dv)) {
    attend_tile(p, q, k, v, out, b, h, i0, i1, kb, ke, partial_o, partial_state, true);
    return;
  }
  if (!final_pass) {
    rows_map(partial_o, n, dv, Eigen::OuterStride<>(dv)) = o;
    std::copy(ws.state.begin(), ws.state.begin() + n, partial_state);
    return;
  }
  for (index_t r = 0; r < n; ++r) {
    const softmax_state st = ws.state[r];
    float* dst = out.ptr(b, h, i0 + r);
    Eigen::Map<Eigen::RowVectorXf> orow(dst, dv);
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
  if (splits == 1) {
    parallel_for(nthreads, items, [&](index_t item) {
      index_t b, h, t;
      item_coords(item, b, h, t);
      const index_t i0 = t * cfg::block_q, i1 = std::min(p.q_len, i0 + cfg::block_q);
      attend_tile(p, q, k, v, out, b, h, i0, i1, 0, p.k_len, nullptr, nullptr);
    });
    return;
  }
  // Split keys: chunk c covers keys [c * chunk, (c + 1) * chunk).
  const index_t chunk =
      ((p.k_len + splits - 1) / splits + cfg::block_k - 1) / cfg::block_k * cfg::block_k;
  const index_t rows_stride = cfg::block_q;
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
                part_o.data() + slot * rows_stride * dv, part_state.data() + slot * rows_stride);
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
  static constexpr bool reads_host_memory = true;

  template <class T, class TO>
  static status can_implement(const backend::eigen&, const attention_problem&) {
    static_assert(std::is_same<T, float>::value && std::is_same<TO, float>::value,
                  "alibi::backend::eigen computes in float: q, k, v and out must be float "
                  "(use alibi::backend::reference for double)");
    return {};
  }

  template <class T, class TO>
  static void run(const backend::eigen& be, const attention_problem& p, tensor_view<const T, 4> q,
                  tensor_view<const T, 4> k, tensor_view<const T, 4> v, tensor_view<TO, 4> out) {
    cpu::run(be.threads, p, q, k, v, out);
  }
};

}  // namespace detail
}  // namespace alibi
