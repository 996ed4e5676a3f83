// SPDX-License-Identifier: MIT
// The kernel of alibi::backend::eigen (<alibi/backend/eigen/attention.hpp>): the fused CPU
// attention. Flash-attention style: per (batch, head, query tile) it streams key tiles, S = Q K^T
// through the register-blocked tile products (micro_kernel.hpp), adds the ALiBi bias and the
// masks in one pass, keeps an online softmax (running max and sum) and accumulates O += P V
// through the tile products. The L x L score or bias matrix never exists.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/key_norm_pass.hpp"
#include "alibi/backend/eigen/kv_tiles.hpp"
#include "alibi/backend/eigen/score_tile.hpp"
#include "alibi/backend/eigen/work_plan.hpp"
#include "alibi/backend/host/parallel.hpp"
#include "alibi/backend/host/simd.hpp"
#include "alibi/backend/host/small_rows.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/merge.hpp"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// The online-softmax step of a scored tile: moves each row's state to its new maximum (the
/// factor for its accumulated output in ws.alpha) and turns the scores into probabilities in
/// place. Returns whether some row's accumulated output must be rescaled.
inline bool softmax_tile(const score_tile_view& tile, workspace& ws) {
  const index_t ra = tile.ra, m = tile.m, mp = packet_rows(m), bk = tile.bk;
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
  return rescale;
}

/// Adds the contribution of the tile's keys whose V rows stayed out of the P V product
/// (ws.bad): a non-finite V row still reaches exactly the rows that attend to it, even where
/// its weight rounded to 0 (0 * NaN = NaN, as the mathematics has it); an excluded key has
/// no such row. p(t, j): probability of local row t for key j; o_row(t): its output row.
template <class P, class ORow>
void add_bad_keys(const workspace& ws, const kv_tile& kv, const P& p, ORow&& o_row) {
  for (index_t u = 0; u < ws.bad_count; ++u) {
    const index_t j = ws.bad[u];
    for (index_t t = ws.c0[j]; t < ws.c1[j]; ++t) o_row(t) += p(t, j) * kv.v.row(j);
  }
}

/// The online-softmax step of a scored tile (softmax_tile), then the rows' accumulated
/// output o (n, Dv) rescaled and P V added: column-major tiles by the register-blocked
/// tile_product (the rescale applied as it loads o), row-major ones by Eigen's GEMM.
inline void accumulate_tile(const item_rows& it, const score_tile_view& tile, const kv_tile& kv,
                            workspace& ws, cols_map& o) {
  const index_t ra = tile.ra, m = tile.m, bk = tile.bk;
  const index_t dv = it.p->v_head_dim;
  const bool rescale = softmax_tile(tile, ws);
  float* s = ws.s.data();
  auto o_act = o.middleRows(ra, m);  // (m, Dv)
  // V rows (bk, Dv), with the rows that must stay out of P V zeroed (ws.bad) in a copy.
  const tile_rows<float> vr =
      rows_for_products(kv.v.data(), kv.v.outerStride(), bk, dv, ws, [&] { return ws.tile_v(dv); });
  const float* v = vr.data;
  const index_t ldv = vr.ld;
  if (!tile.by_rows) {
    // The padding rows of P are zeros in the score tile's scratch rows; o's rows past the
    // tile are other rows of the item (exact_rows).
    tile_product<true, false>(m, dv, bk, s, tile.lds, v, ldv, o_act.data(), o.outerStride(),
                              rescale ? ws.alpha.data() + ra : nullptr, true);
    if (ws.bad_count > 0)
      add_bad_keys(
          ws, kv, [&](index_t t, index_t j) { return s[j * tile.lds + t]; },
          [&](index_t t) { return o_act.row(t); });
    return;
  }
  if (rescale) o_act.array().colwise() *= Eigen::Map<const Eigen::ArrayXf>(ws.alpha.data() + ra, m);
  const rows_map p(s, m, bk, Eigen::OuterStride<>(tile.lds));  // (m, bk) probabilities
  o_act.noalias() += p * Eigen::Map<const row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>(
                             v, bk, dv, Eigen::OuterStride<>(ldv));
  if (ws.bad_count > 0) add_bad_keys(ws, kv, p, [&](index_t t) { return o_act.row(t); });
}

/// Requests the rows (n, cols) of x into L2 (a prefetch of every 64-byte line).
template <class T>
void request_rows(const tile_rows<T>& x, index_t n, index_t cols) {
  constexpr index_t line = 64 / sizeof(T);
  for (index_t r = 0; r < n; ++r)
    for (index_t c = 0; c < cols; c += line) __builtin_prefetch(x.data + r * x.ld + c, 0, 2);
}

/// Far-tile skipping for one item (ALiBi-specific; the bound is detail::far_tile_bound):
/// whether the keys left on one side are negligible for every row.
class far_tile_skipper {
 public:
  far_tile_skipper(const item_rows& it, const const_rows_map& qm, key_norms norms, workspace& ws)
      : it_(it), norms_(norms), ws_(&ws) {
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
    for (index_t r = 0; r < it_.n; ++r)
      if (!left_negligible(bound_, row(r), kmax, x)) return false;
    return true;
  }
  /// Keys [x, ue) remain on the right.
  bool right(index_t x) const {
    const float kmax = norms_.suffix[x / kernel_config::block_k];
    for (index_t r = 0; r < it_.n; ++r)
      if (!right_negligible(bound_, row(r), kmax, x)) return false;
    return true;
  }

 private:
  far_row row(index_t r) const {
    return far_row{it_.qo + it_.i0 + r - it_.ko,
                   ws_->begin[r],
                   ws_->end[r],
                   ws_->shift[r],
                   ws_->qnorm[r],
                   ws_->state[r]};
  }
  item_rows it_;
  key_norms norms_;
  workspace* ws_;
  far_tile_bound bound_{};
  bool enabled_ = false;
};

/// Where an item's result goes: the output rows and logsumexp (final), or the unnormalized
/// partial output rows (dense (n, Dv)) and their softmax states, for merge_splits.
struct item_sink {
  tensor_view<float, 4> out;
  float* partial_o = nullptr;  // null when Dv = 0 too: the flag, not the pointer, decides
  softmax_state* partial_state = nullptr;
  bool partial = false;
  bool final_pass() const { return !partial; }
};

/// Writes the finished rows of an item; o: its (n, Dv) unnormalized output.
template <class O>
void finish_rows(const item_rows& it, const workspace& ws, const O& o, const item_sink& sink) {
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
      p.lse(it.b, it.h, it.i0 + r) =
          p.lse_shifted_base2 ? st.lse2() : st.lse(-it.slope * static_cast<float>(ws.shift[r]));
  }
}

/// Padded query rows [max(i0, len_q), i1) of head h: zeros and logsumexp -inf.
inline void write_padded_rows(const attention_problem& p, const tensor_view<float, 4>& out,
                              index_t b, index_t h, index_t i0, index_t i1) {
  for (index_t i = std::max(i0, p.len_q(b)); i < i1; ++i) {
    std::fill(out.ptr(b, h, i), out.ptr(b, h, i) + p.v_head_dim, 0.0f);
    if (p.lse.data) p.lse(b, h, i) = -std::numeric_limits<float>::infinity();
  }
}

/// One query head of attend_heads: its rows, its skipping bound, how far it has got.
struct head_pass {
  item_rows it;
  far_tile_skipper skip;
  workspace* ws;
  bool left_done = false, right_done = false;
  index_t tiles_done = 0, tiles_skipped = 0;
  score_tile_view tile{};  // the tile in hand (small calls)
  bool meets = false;      // whether the tile in hand has rows of this head
};

/// The per-thread workspaces of the small calls' query heads (decoding): one per head of a
/// GQA group, each with room for kernel_config::small_rows rows.
inline workspace* small_workspaces(index_t heads) {
  thread_local std::vector<workspace> w;
  while (static_cast<index_t>(w.size()) < heads)
    w.emplace_back(kernel_config::small_rows + 16);  // room for packet padding
  return w.data();
}

/// The opening of a small call's tile: each head not yet done on this side begins its score
/// tile (begin_score_tile; hp.meets); the query rows of the heads that meet it go to q_rows
/// and their score rows (ws.s) to s_rows, head after head. Returns the first head that meets
/// the tile (nullptr: none).
inline const head_pass* begin_small_tile(std::vector<head_pass>& heads, bool head_pass::*done,
                                         const tensor_view<const float, 4>& q, const kv_tile& kv,
                                         index_t j0, bool careful,
                                         std::vector<const float*>& q_rows,
                                         std::vector<float*>& s_rows) {
  q_rows.clear();
  s_rows.clear();
  const head_pass* first = nullptr;
  for (head_pass& hp : heads) {
    hp.meets = !(hp.*done) && begin_score_tile(hp.it, kv, j0, careful, true, *hp.ws, hp.tile);
    if (!hp.meets) continue;
    if (!first) first = &hp;
    for (index_t t = 0; t < hp.tile.m; ++t) {
      q_rows.push_back(q.ptr(hp.it.b, hp.it.h, hp.it.i0 + hp.tile.ra + t));
      s_rows.push_back(hp.ws->s.data() + t * hp.tile.lds);
    }
  }
  return first;
}

/// The step of a small call's tile between its two products: each head that meets the tile
/// (hp.meets) turns its dot products into scores (finish_score_tile) and takes its
/// online-softmax step, its accumulated output rescaled; its probability rows go to p_rows
/// and its output rows (ws.o, leading dimension ldo) to o_rows, head after head, for P V.
inline void softmax_heads(std::vector<head_pass>& heads, index_t ldo, index_t dv,
                          std::vector<const float*>& p_rows, std::vector<float*>& o_rows) {
  p_rows.clear();
  o_rows.clear();
  for (head_pass& hp : heads) {
    if (!hp.meets) continue;
    ++hp.tiles_done;
    workspace& ws = *hp.ws;
    finish_score_tile(hp.it, hp.tile, ws);
    const bool rescale = softmax_tile(hp.tile, ws);
    for (index_t t = 0; t < hp.tile.m; ++t) {
      float* o = ws.o.data() + (hp.tile.ra + t) * ldo;
      if (rescale) Eigen::Map<Eigen::RowVectorXf>(o, dv) *= ws.alpha[hp.tile.ra + t];
      p_rows.push_back(ws.s.data() + t * hp.tile.lds);
      o_rows.push_back(o);
    }
  }
}

/// One key tile for the heads of a small call, whose rows all go through one pass of the
/// small-row products (small_rows.hpp): each K and V row of the tile is read once for all
/// the heads' rows. Each head's scores are row-major in its workspace (ws.s), its output
/// row-major in ws.o (leading dimension ldo); `ahead` requests the next tile's K and V rows
/// as the products go (its plan is the caller's).
/// The products read the tile's K and V rows from `k` and `v` (fp32, or half precision
/// widened in registers); `kv` is read only by the careful path (non-finite V rows).
template <class T>
void small_tile(std::vector<head_pass>& heads, bool head_pass::*done,
                const tensor_view<const float, 4>& q, const kv_tile& kv, index_t j0, bool careful,
                index_t ldo, paced_prefetch& ahead, tile_rows<T> k, tile_rows<T> v) {
  const attention_problem& p = *heads.front().it.p;
  const index_t d = p.head_dim, dv = p.v_head_dim;
  thread_local std::vector<const float*> in_rows;
  thread_local std::vector<float*> out_rows;
  // The keys left out of P V are the same for every head: the first one's.
  const head_pass* first = begin_small_tile(heads, done, q, kv, j0, careful, in_rows, out_rows);
  if (!first) return;
  const index_t rows = static_cast<index_t>(in_rows.size()), bk = first->tile.bk;
  auto pace = [&]() { ahead.tick<paced_prefetch::keys_phase>(); };
  if (k.blocked)
    small_block_scores(in_rows.data(), rows, k.data, k.ld, k.offset, bk, d, out_rows.data(), pace);
  else
    small_scores(in_rows.data(), rows, k.data, k.ld, bk, d, out_rows.data(), pace);

  softmax_heads(heads, ldo, dv, in_rows, out_rows);
  small_pv(in_rows.data(), rows, v.data, v.ld, bk, dv, first->ws->bad.data(), first->ws->bad_count,
           out_rows.data(), [&]() { ahead.tick<paced_prefetch::values_phase>(); });
  for (head_pass& hp : heads) {
    if (!hp.meets || hp.ws->bad_count == 0) continue;
    const float* s = hp.ws->s.data();
    const index_t lds = hp.tile.lds, ra = hp.tile.ra;
    add_bad_keys(
        *hp.ws, kv, [&](index_t t, index_t j) { return s[t * lds + j]; },
        [&](index_t t) {
          return Eigen::Map<Eigen::RowVectorXf>(hp.ws->o.data() + (ra + t) * ldo, dv);
        });
  }
}

/// One key tile for the query heads of several KV heads whose K and V rows of a key make
/// one run of memory with the other heads' (the tokens outermost: work_plan::all_kv_heads):
/// Q K^T for every head, block of keys after block of keys (kv_source::token_block_keys), then
/// each head's softmax, then P V block after block. So the call reads the tile's K rows of all
/// heads and then its V rows as two ascending runs, and each block, requested while the block
/// before it is computed (`ahead`), stays in L2 while every head uses it. Per KV head it runs
/// the products of small_tile on the same keys in the same order, so each head's result is
/// bitwise the one it gets with the heads of its KV head alone. next_j0: the tile after this
/// one (-1: none), whose first K block the last P V block requests. Not for the careful path
/// (its excluded keys are those of the key mask, the same for every head).
template <class T>
void small_tile_kv_heads(std::vector<head_pass>& heads, bool head_pass::*done,
                         const tensor_view<const float, 4>& q, const kv_source<T>& kv,
                         const kv_tile& unread, index_t j0, index_t next_j0, index_t ldo,
                         paced_prefetch& ahead) {
  const item_rows& it0 = heads.front().it;
  const attention_problem& p = *it0.p;
  const index_t b = it0.b, d = p.head_dim, dv = p.v_head_dim;
  const index_t block = kv.token_block_keys();
  struct kv_head_rows {  // the rows [begin, end) of the call's rows, of one KV head
    index_t hk, begin, end;
  };
  thread_local std::vector<kv_head_rows> groups;
  thread_local std::vector<const float*> in_rows, in_at;
  thread_local std::vector<float*> out_rows, out_at;
  thread_local std::vector<index_t> block_bad;
  const head_pass* first = begin_small_tile(heads, done, q, unread, j0, false, in_rows, out_rows);
  if (!first) return;
  groups.clear();
  index_t row = 0;  // the first row of hp
  for (const head_pass& hp : heads) {
    if (!hp.meets) continue;
    if (groups.empty() || groups.back().hk != hp.it.hk) groups.push_back({hp.it.hk, row, row});
    row += hp.tile.m;
    groups.back().end = row;
  }
  const index_t rows = static_cast<index_t>(in_rows.size()), bk = first->tile.bk;
  in_at.resize(static_cast<std::size_t>(rows));
  out_at.resize(static_cast<std::size_t>(rows));
  // The next block in reading order: keys [j, j + n) of K or V, as one run.
  auto request = [&](auto phase, bool keys, index_t j, index_t n) {
    ahead.plan_run<decltype(phase)::value>(n > 0 ? kv.token_rows(keys, b, j) : nullptr,
                                           kv.token_run_bytes(keys, n));
  };
  using keys_phase = std::integral_constant<int, paced_prefetch::keys_phase>;
  using values_phase = std::integral_constant<int, paced_prefetch::values_phase>;
  auto pace_k = [&]() { ahead.tick<paced_prefetch::keys_phase>(); };
  auto pace_v = [&]() { ahead.tick<paced_prefetch::values_phase>(); };

  for (index_t s = 0; s < bk; s += block) {  // Q K^T; then the tile's first V block
    const index_t n = std::min(block, bk - s);
    if (s + block < bk)
      request(keys_phase{}, true, j0 + s + block, std::min(block, bk - s - block));
    else
      request(keys_phase{}, false, j0, std::min(block, bk));
    for (index_t r = 0; r < rows; ++r) out_at.data()[r] = out_rows.data()[r] + s;
    for (const kv_head_rows& g : groups)
      small_scores(in_rows.data() + g.begin, g.end - g.begin, kv.rows(true, b, g.hk, j0 + s).data,
                   kv.k.strides[2], n, d, out_at.data() + g.begin, pace_k);
    ahead.finish_run<paced_prefetch::keys_phase>();
  }

  softmax_heads(heads, ldo, dv, in_rows, out_rows);
  // The keys left out of P V (those the key mask excludes) are the same for every head.
  const index_t* bad = first->ws->bad.data();
  const index_t nbad = first->ws->bad_count;
  for (index_t s = 0, u = 0; s < bk; s += block) {  // P V; then the next tile's first K block
    const index_t n = std::min(block, bk - s);
    if (s + block < bk)
      request(values_phase{}, false, j0 + s + block, std::min(block, bk - s - block));
    else
      request(values_phase{}, true, next_j0, next_j0 >= 0 ? std::min(block, it0.ue - next_j0) : 0);
    block_bad.clear();
    for (; u < nbad && bad[u] < s + n; ++u) block_bad.push_back(bad[u] - s);
    for (index_t r = 0; r < rows; ++r) in_at.data()[r] = in_rows.data()[r] + s;
    for (const kv_head_rows& g : groups)
      small_pv(in_at.data() + g.begin, g.end - g.begin, kv.rows(false, b, g.hk, j0 + s).data,
               kv.v.strides[2], n, dv, block_bad.data(), static_cast<index_t>(block_bad.size()),
               out_rows.data() + g.begin, pace_v);
    ahead.finish_run<paced_prefetch::values_phase>();
  }
}

/// Query rows [i0, i1) of the query heads [h0, h0 + nh) of batch entry b, all of one KV
/// head (or, for a small call whose KV heads' rows of a key make one run of memory, with
/// skipping off and not careful, of several: small_tile_kv_heads), against the keys
/// [kb, ke); head h's result goes to sink_of(h) and it works in wss[h - h0]. The heads share each
/// K/V tile: a tile is read from memory (and converted from half precision) once for all of them,
/// which is what makes a GQA decode step stream each K/V byte once. Small calls (decoding) go
/// through the small-row products, the others through the tile products one head at a time. With
/// far-tile skipping, tiles are visited nearest-first (the tile holding the key nearest the middle
/// row, then outward to the left, then to the right), so that the running maxima are good before
/// the far-tile bound is consulted, and each head stops on a side as soon as its own bound allows.
/// A head thus computes exactly the tiles, in the order and with the arithmetic, that it would
/// alone: its result does not depend on the other heads of the call.
template <bool Small, class T, class SinkOf>
void attend_heads(const attention_problem& p, const tensor_view<const float, 4>& q,
                  const kv_source<T>& kv, const SinkOf& sink_of, index_t b, index_t h0, index_t nh,
                  index_t i0, index_t i1, index_t kb, index_t ke, key_norms norms, workspace* wss,
                  bool careful = false) {
  constexpr index_t bk = kernel_config::block_k;
  for (index_t h = h0; h < h0 + nh; ++h)
    if (sink_of(h).final_pass()) write_padded_rows(p, sink_of(h).out, b, h, i0, i1);
  const index_t n = std::min(i1, p.len_q(b)) - i0, d = p.head_dim, dv = p.v_head_dim;
  if (n <= 0) return;

  auto q_rows = [&](index_t h) {  // (n, D)
    return const_rows_map(q.ptr(b, h, i0), n, d, Eigen::OuterStride<>(q.strides[2]));
  };
  // The unnormalized output (n, Dv): row-major for the small-row products, column-major for
  // the GEMMs.
  const index_t ldo = Small ? padded_stride(std::max<index_t>(dv, 1)) : 0;
  auto o_rows = [&](const head_pass& hp) {
    if constexpr (Small)
      return rows_map(hp.ws->o.data(), n, dv, Eigen::OuterStride<>(ldo));
    else
      return cols_map(hp.ws->o.data(), n, dv, Eigen::OuterStride<>(hp.ws->ld()));
  };
  thread_local std::vector<head_pass> heads;
  heads.clear();
  for (index_t u = 0; u < nh; ++u) {
    workspace& ws = wss[u];
    ws.reserve(dv);
    const item_rows it = prepare_rows(p, b, h0 + u, i0, n, kb, ke, ws);
    heads.push_back(head_pass{it, far_tile_skipper(it, q_rows(h0 + u), norms, ws), &ws});
    o_rows(heads.back()).setZero();
    if constexpr (!Small)
      pack_columns(q.ptr(b, h0 + u, i0), q.strides[2], n, d, ws.ld(), ws.q_cols(d), ws.ld());
  }
  // The key ranges, hence ub, ue and the visiting order, do not depend on the head.
  const item_rows& it0 = heads.front().it;
  const bool several_kv_heads = p.kv_head(h0) != p.kv_head(h0 + nh - 1);
  paced_prefetch ahead;
  // One tile; next_j0: the tile visited after it (-1: none).
  auto process = [&](index_t j0, index_t next_j0, bool head_pass::*done) {
    const index_t n_keys = std::min(bk, it0.ue - j0);
    if constexpr (Small) {
      // The tile's shape alone, for the products that read K and V in place.
      const kv_tile unread{kv_rows_map(nullptr, n_keys, d, Eigen::OuterStride<>(d)),
                           kv_rows_map(nullptr, n_keys, dv, Eigen::OuterStride<>(dv))};
      if (several_kv_heads) {
        // work_plan::all_kv_heads: skipping off (norms are one KV head's), never careful.
        ALIBI_ASSERT(norms.prefix == nullptr && !careful);
        small_tile_kv_heads(heads, done, q, kv, unread, j0, next_j0, ldo, ahead);
        return;
      }
      // The next tile's K and V rows are requested while this tile goes through the products,
      // spread over all of them (paced_prefetch), whatever the number of rows. The hardware
      // prefetcher alone falls behind once the products spend long enough on each K/V byte:
      // from one row in half precision (its rows are also widened as they are read), from
      // four rows in fp32. Spread requests also beat the bursts they replaced (each next K
      // row during the first rows' Q K^T, each block of V rows before its P V). fp32 with one
      // row (16 FMAs per KiB) was left to the hardware prefetcher while the schedule's
      // bookkeeping sat in the products; with the two-stream schedule the requests pay there
      // too, except on one thread where K/V partly fits in the last-level cache: there the
      // requests' own instructions are not hidden behind memory
      // (docs/journal/2026-12-design-measurements.md,
      // "attention_kernel.hpp: attend_heads, the next tile's requests").
      if (next_j0 >= 0)
        ahead.plan(kv.rows(true, b, it0.hk, next_j0), d, kv.rows(false, b, it0.hk, next_j0), dv,
                   std::min(bk, it0.ue - next_j0));
      else
        ahead.plan_nothing();
      if ((!std::is_same<T, float>::value || kv.blocked()) && !careful) {
        // Half-precision K/V: the products widen it in registers as they read it (a
        // converted copy would be written and read back, and the conversion loop would wait
        // for memory with no arithmetic beside it). K in blocks: the products read the
        // blocks in place (fp32 V too).
        small_tile(heads, done, q, unread, j0, careful, ldo, ahead, kv.rows(true, b, it0.hk, j0),
                   kv.rows(false, b, it0.hk, j0));
      } else {
        // fp32 rows in place, or (careful path) K in blocks or half precision converted
        // into fp32 tiles.
        const kv_tile tile_kv = kv.tile(b, it0.hk, j0, n_keys);
        small_tile(heads, done, q, tile_kv, j0, careful, ldo, ahead,
                   tile_rows<float>{tile_kv.k.data(), tile_kv.k.outerStride()},
                   tile_rows<float>{tile_kv.v.data(), tile_kv.v.outerStride()});
      }
      ahead.finish();
    } else {
      const kv_tile tile_kv = kv.tile(b, it0.hk, j0, n_keys);
      // The next tile's K and V rows are requested into L2 before this tile's products: the
      // products read K and V in place, and a long sequence's K/V are not in the caches (the
      // items of one head run far apart). A tile's products take far longer than its K/V
      // take to arrive, so a burst of requests at its start costs little.
      if (next_j0 >= 0 && std::is_same<T, float>::value && !kv.blocked()) {
        const index_t next_keys = std::min(bk, it0.ue - next_j0);
        request_rows(kv.rows(true, b, it0.hk, next_j0), next_keys, d);
        request_rows(kv.rows(false, b, it0.hk, next_j0), next_keys, dv);
      }
      for (head_pass& hp : heads) {
        if (hp.*done) continue;
        score_tile_view tile;
        if (!compute_score_tile(hp.it, q_rows(hp.it.h), tile_kv, j0, careful, *hp.ws, tile,
                                hp.ws->q.data(), hp.ws->ld()))
          continue;
        ++hp.tiles_done;
        cols_map o = o_rows(hp);
        accumulate_tile(hp.it, tile, tile_kv, *hp.ws, o);
      }
    }
  };
  // Marks the heads whose remaining tiles on one side are negligible (`remaining` skipped
  // tiles); false when every head is done on that side.
  auto any_left = [&](bool head_pass::*done, index_t remaining, auto&& negligible) {
    bool any = false;
    for (head_pass& hp : heads) {
      if (!(hp.*done) && hp.skip.enabled() && negligible(hp.skip)) {
        hp.*done = true;
        hp.tiles_skipped += remaining;
      }
      any |= !(hp.*done);
    }
    return any;
  };
  const index_t ntiles = it0.ub < it0.ue ? (it0.ue - it0.ub + bk - 1) / bk : 0;
  if (Small && norms.prefix == nullptr) {
    // Without far-tile skipping the order does not matter to the result's accuracy: small
    // calls then read their tiles in ascending addresses, the order the hardware prefetcher
    // follows best (the same order for every head of the call). Nearest-first (for a decode
    // step: descending), which saves most online-softmax rescales, made long steps slower
    // although each tile's next one is requested in software, with the arithmetic alone
    // unchanged (docs/journal/2026-12-design-measurements.md,
    // "attention_kernel.hpp: attend_heads, the tile order").
    for (index_t t = 0; t < ntiles; ++t)
      process(it0.ub + t * bk, t + 1 < ntiles ? it0.ub + (t + 1) * bk : -1, &head_pass::left_done);
  } else if (ntiles > 0) {
    const index_t center =
        std::clamp<index_t>(it0.qo + it0.i0 + it0.n / 2 - it0.ko - it0.ub, 0, it0.ue - it0.ub - 1) /
        bk;
    for (index_t t = center; t >= 0; --t) {
      const index_t x = std::min(it0.ue, it0.ub + (t + 1) * bk);
      if (t < center && !any_left(&head_pass::left_done, t + 1,
                                  [&](const far_tile_skipper& s) { return s.left(x); }))
        break;
      // The tile after this one: the next to the left, or the first to the right.
      const index_t next = t > 0 ? it0.ub + (t - 1) * bk : it0.ub + (center + 1) * bk;
      process(it0.ub + t * bk, next < it0.ue ? next : -1, &head_pass::left_done);
    }
    for (index_t t = center + 1; t < ntiles; ++t) {
      const index_t x = it0.ub + t * bk;
      if (!any_left(&head_pass::right_done, ntiles - t,
                    [&](const far_tile_skipper& s) { return s.right(x); }))
        break;
      process(x, t + 1 < ntiles ? x + bk : -1, &head_pass::right_done);
    }
  }

  // P V through a GEMM multiplies masked probabilities (exact zeros) by every V row of the
  // tile, so a non-finite V row would reach rows that never attend to it (0 * NaN = NaN);
  // so do the small-row products. Checking every tile would cost time on every call
  // (docs/journal/2026-12-design-measurements.md,
  // "attention_kernel.hpp: attend_heads, the non-finite check"); instead a non-finite
  // result, which finite inputs never produce, sends the whole call through the careful
  // path that keeps such rows out of the products and adds their contribution only where
  // the probability is non-zero.
  if (!careful) {
    index_t done = 0, skipped = 0;
    bool finite = true;
    for (const head_pass& hp : heads) {
      done += hp.tiles_done;
      skipped += hp.tiles_skipped;
      finite = finite && (Small ? all_finite(hp.ws->o.data(), ldo, n, dv)
                                : all_finite(hp.ws->o.data(), hp.ws->ld(), dv, n));
    }
    if (p.stats) add_stats(p.stats, done, skipped);
    if (!finite) {
      // The careful path one KV head at a time (its excluded keys depend on the V rows).
      for (index_t g0 = h0; g0 < h0 + nh;) {
        index_t g1 = g0 + 1;
        while (g1 < h0 + nh && p.kv_head(g1) == p.kv_head(g0)) ++g1;
        attend_heads<Small>(p, q, kv, sink_of, b, g0, g1 - g0, i0, i1, kb, ke, norms,
                            wss + (g0 - h0), true);
        g0 = g1;
      }
      return;
    }
  }
  for (const head_pass& hp : heads) finish_rows(hp.it, *hp.ws, o_rows(hp), sink_of(hp.it.h));
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
      p.lse(b, h, i0 + r) = p.lse_shifted_base2
                                ? total.lse2()
                                : total.lse(-p.slope(b, h) * static_cast<float>(p.distance_shift(
                                                                 b, i0 + r, p.slope(b, h) < 0.0f)));
  }
}

template <class T>
void run(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
         const kv_source<T>& kv, const tensor_view<float, 4>& out) {
  if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0) return;
  const int nthreads = resolve_threads(threads);
  const index_t grid = (p.k_len + kernel_config::block_k - 1) / kernel_config::block_k;
  const bool skipping = p.skips_far_tiles(grid) && p.any_positive_slope();
  const work_plan plan = work_plan::make(p, kv_memory::of(kv), skipping);

  // The calling thread's buffers, named by reference: a thread_local named inside the
  // lambdas would be each worker's own instance.
  thread_local aligned_buffer<float> prefix_buf, suffix_buf, part_o_buf;
  thread_local aligned_buffer<softmax_state> part_state_buf;
  if (skipping) {
    const auto size = static_cast<std::size_t>(p.batch * p.kv_heads * grid);
    prefix_buf.reserve(size);
    suffix_buf.reserve(size);
    compute_key_norms(nthreads, p, kv, grid, prefix_buf.data(), suffix_buf.data());
  }
  const float* prefix = prefix_buf.data();
  const float* suffix = suffix_buf.data();
  auto norms_for = [&](index_t b, index_t hk) {
    key_norms kn;
    if (skipping) {
      kn.prefix = prefix + (b * p.kv_heads + hk) * grid;
      kn.suffix = suffix + (b * p.kv_heads + hk) * grid;
    }
    return kn;
  };
  const index_t dv = p.v_head_dim;
  if (plan.splits > 1) {
    const index_t slots = plan.items * plan.splits;
    part_o_buf.reserve(static_cast<std::size_t>(slots * plan.rows_stride * dv));
    part_state_buf.reserve(static_cast<std::size_t>(slots * plan.rows_stride));
  }
  float* part_o = part_o_buf.data();
  softmax_state* part_state = part_state_buf.data();

  parallel_for(nthreads, plan.units * plan.splits, [&](index_t work) {
    const index_t unit = plan.chunk_major ? work % plan.units : work / plan.splits;
    const index_t c = plan.chunk_major ? work / plan.units : work % plan.splits;
    index_t b, h0, i0, i1;
    plan.coords(unit * plan.group, b, h0, i0, i1);
    const index_t kb = c * plan.chunk, ke = std::min(p.k_len, (c + 1) * plan.chunk);
    auto sink_of = [&](index_t h) {
      if (plan.splits == 1) return item_sink{out};
      const index_t slot = plan.item_of(b, h, i0) * plan.splits + c;
      return item_sink{out, part_o + slot * plan.rows_stride * dv,
                       part_state + slot * plan.rows_stride, true};
    };
    // Rows of a chunk without keys keep the empty state (merge_splits skips them).
    if (plan.splits > 1)
      for (index_t h = h0; h < h0 + plan.group; ++h)
        std::fill(sink_of(h).partial_state, sink_of(h).partial_state + (i1 - i0), softmax_state{});
    // The small-row products for every item with at most small_rows valid query rows, in a
    // small call or not: a sequence computes the same bits alone as padded in a batch.
    const key_norms norms = norms_for(b, p.kv_head(h0));
    if (plan.small)
      attend_heads<true>(p, q, kv, sink_of, b, h0, plan.group, i0, i1, kb, ke, norms,
                         small_workspaces(plan.group));
    else if (std::min(i1, p.len_q(b)) - i0 <= kernel_config::small_rows)
      attend_heads<true>(p, q, kv, sink_of, b, h0, 1, i0, i1, kb, ke, norms, small_workspaces(1));
    else
      attend_heads<false>(p, q, kv, sink_of, b, h0, 1, i0, i1, kb, ke, norms, &thread_workspace());
  });
  if (plan.splits == 1) return;
  parallel_for(nthreads, plan.items, [&](index_t item) {
    index_t b, h, i0, i1;
    plan.coords(item, b, h, i0, i1);
    write_padded_rows(p, out, b, h, i0, i1);  // as in the unsplit path
    const index_t slot = item * plan.splits;
    merge_splits(p, out, b, h, i0, i1, plan.splits, part_o + slot * plan.rows_stride * dv,
                 part_state + slot * plan.rows_stride, plan.rows_stride);
  });
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

namespace cpu {
inline namespace ALIBI_CPU_ISA {

template <class TKV>
void attention_kernel(int threads, const attention_problem& p, const tensor_view<const float, 4>& q,
                      const tensor_view<const TKV, 4>& k, const tensor_view<const TKV, 4>& v,
                      const tensor_view<float, 4>& out, const tensor_view<const TKV, 5>& k_blocks) {
  run(threads, p, q, kv_source<TKV>{k, v, k_blocks}, out);
}

template <class T>
void merge_kernel(int threads, const partial_merge_args<T>& a) {
  parallel_for(resolve_threads(threads), a.out.extents[0] * a.out.extents[1],
               [&](index_t bh) { merge_head_rows(a, bh); });
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

}  // namespace detail
}  // namespace alibi
