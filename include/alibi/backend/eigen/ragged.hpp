// SPDX-License-Identifier: MIT
// alibi::backend::eigen for ragged calls (alibi/ragged_attention.hpp): paged or contiguous
// K/V of many sequences, float, half, bfloat16 or int8. One work item is the rows of one
// sequence and a block of its KV heads (each with the query heads of its GQA group) over a
// chunk of its positions. It walks the sequence's keys in tiles of ragged_key_tile keys from
// the nearest to the farthest, head after head, and keeps the online softmax per row. Items
// of a few rows (decode steps) read K and V in place with the decode products of
// small_rows.hpp, page run by page run; items of ragged_gemm_rows rows or more (prefill
// chunks) multiply with the register-blocked tile products (micro_kernel.hpp) on a widened
// copy of each tile. Never a whole dequantized copy.
// Header-only (it compiles in the caller's file, also where alibi::kernels is linked).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include <Eigen/Core>

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/host/micro_kernel.hpp"
#include "alibi/backend/host/parallel.hpp"
#include "alibi/backend/host/simd.hpp"
#include "alibi/backend/host/small_rows.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"
#include "alibi/ragged_attention.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// Per-thread scratch of the ragged kernel, 64-byte aligned with padded leading dimensions
/// (workspace's why). kt, vt: a tile's K and V rows widened to fp32; kc: kt as columns.
struct ragged_scratch {
  aligned_buffer<float> q, s, p8, o, qnorm, scales, kt, kc, vt;
  aligned_buffer<softmax_state> state;
  aligned_buffer<row_frame> frames;
  aligned_buffer<const float*> q_rows;
  aligned_buffer<float*> s_rows, p_rows, o_rows;
  aligned_buffer<index_t> head_tiles;
  aligned_buffer<int> q_exp;  // per row: the power of two its q copy was divided by (int8)
};

inline ragged_scratch& ragged_scratch_for_thread() {
  static thread_local ragged_scratch scratch;
  return scratch;
}

/// Divides a query row by a power of two 2^k where int8 keys read in place could overflow its
/// scores, and returns k (0 for every row of ordinary magnitude). Why: q . k_q sums terms up
/// to |q_e| x 127 before the key's scale applies, so it overflows fp32 at a |q| about
/// 127 / max|k| times smaller than q . k itself does (max|k| = 1: |q_e| ~ 1e35 at D = 64).
/// Dividing by 2^k is exact, and the scores multiply 2^k back after the scale.
inline int prescale_int8_query(float* row, index_t n) {
  double bound = 0.0;  // >= every partial sum of |q_e x k_q,e|
  for (index_t e = 0; e < n; ++e) bound += std::fabs(static_cast<double>(row[e]));
  bound *= 127.0;
  if (!(bound >= 0x1p126) || !std::isfinite(bound)) return 0;
  const int k = std::ilogb(bound) - 125;  // bound / 2^k < 2^126
  for (index_t e = 0; e < n; ++e) row[e] = std::ldexp(row[e], -k);
  return k;
}

/// Rows (positions x the heads of a GQA group) from which a work item's products are the
/// register-blocked tile products over a widened copy of each tile instead of the decode
/// products (small_rows.hpp), which read K and V in place but only reach GEMM speed for a
/// few rows.
inline constexpr index_t ragged_gemm_rows = 32;

/// Query positions per work item for a sequence bringing q_len rows: the heads of a GQA group
/// share each K/V tile, with up to 64 rows (positions x heads) for decode steps and short
/// runs, and up to 256 for prefill chunks, whose GEMMs gain from more rows. Depends on the
/// sequence alone, so a sequence computes the same bits in any batch.
inline index_t ragged_positions_per_item(index_t group, index_t q_len) {
  const index_t g = std::max<index_t>(group, 1);
  return std::max<index_t>(1, (q_len * g > 64 ? 256 : 64) / g);
}

/// n stored K/V elements as floats (int8: times its scale), for the GEMM path's tile copy.
template <class T>
ALIBI_FORCEINLINE void widen_row(const T* src, float scale, float* dst, index_t n) {
  namespace ei = Eigen::internal;
  index_t e = 0;
#if defined(EIGEN_VECTORIZE)
  const packet vs = ei::pset1<packet>(scale);
  for (; e + lanes <= n; e += lanes) {
    const packet x = load_floats(src + e);
    ei::pstoreu(dst + e, is_int8_kv<T> ? ei::pmul(x, vs) : x);
  }
#endif
  for (; e < n; ++e)
    dst[e] = is_int8_kv<T> ? static_cast<float>(src[e]) * scale : static_cast<float>(src[e]);
}

/// The far-tile bound's key norms: for sequence s, KV head g and tile t, the largest bound
/// over the pages (or the contiguous layout's key_norm_block blocks) that hold its keys
/// [0, min((t + 1) ragged_key_tile, n)) (a prefix maximum: the side test bounds every key
/// left of a tile end). fill() writes them for all KV heads of one sequence into prefix
/// (kv_heads, tiles), reading each page's row of norms once; `has` is false where the
/// layout has none.
template <class KV>
struct ragged_norms;

template <class T>
struct ragged_norms<paged_kv<T>> {
  static bool has(const paged_kv<T>& kv, const attention_problem&) {
    return kv.page_key_norms.data != nullptr;
  }
  static void fill(const paged_kv<T>& kv, const attention_problem& p, index_t s, index_t n,
                   float* running, float* prefix) {
    const index_t ps = kv.page_size(), tiles = (n + ragged_key_tile - 1) / ragged_key_tile;
    std::fill(running, running + p.kv_heads, 0.0f);
    index_t page = 0;
    for (index_t t = 0; t < tiles; ++t) {
      const index_t end = std::min((t + 1) * ragged_key_tile, n);
      for (; page * ps < end; ++page) {
        const float* row = kv.page_key_norms.ptr(kv.block_table(s, page));
        for (index_t g = 0; g < p.kv_heads; ++g)
          running[g] = max_keep_nan(running[g], row[g * kv.page_key_norms.strides[1]]);
      }
      for (index_t g = 0; g < p.kv_heads; ++g) prefix[g * tiles + t] = running[g];
    }
  }
};

template <class T>
struct ragged_norms<contiguous_kv<T>> {
  static bool has(const contiguous_kv<T>&, const attention_problem& p) {
    return p.key_norm_bounds.data != nullptr;
  }
  static void fill(const contiguous_kv<T>&, const attention_problem& p, index_t s, index_t n,
                   float* running, float* prefix) {
    const index_t tiles = (n + ragged_key_tile - 1) / ragged_key_tile;
    std::fill(running, running + p.kv_heads, 0.0f);
    index_t block = 0;
    for (index_t t = 0; t < tiles; ++t) {
      const index_t end = std::min((t + 1) * ragged_key_tile, n);
      for (; block * key_norm_block < end; ++block)
        for (index_t g = 0; g < p.kv_heads; ++g)
          running[g] = max_keep_nan(running[g], p.key_norm_bounds(s, g, block));
      for (index_t g = 0; g < p.kv_heads; ++g) prefix[g * tiles + t] = running[g];
    }
  }
};

/// One work item: rows of sequence s, KV heads [g0, g1), positions [i0, i1). The heads go
/// through each key tile together, so that with pages (whose rows hold every KV head of a
/// token) the item reads a page's memory in one pass. A head's rows see only its own
/// results: which heads share an item changes no bit of them. `careful` (an item whose
/// result was not finite): each row's P V over its own keys only, so that a NaN or Inf in
/// the V row of a key a row does not see stays out of that row.
template <class KV>
void ragged_item(const ragged_problem& rp, const tensor_view<const float, 3>& q, const KV& kv,
                 const tensor_view<float, 3>& out, const float* norm_prefix, index_t s, index_t g0,
                 index_t g1, index_t i0, index_t i1, bool careful, std::int64_t& computed,
                 std::int64_t& skipped) {
  using T = typename kv_element<KV>::type;
  const attention_problem& p = rp.p;
  const kv_rows<KV> rows{kv};
  const index_t G = p.group_size(), D = p.head_dim, Dv = p.v_head_dim, heads = g1 - g0;
  const index_t Rg = (i1 - i0) * G, R = Rg * heads;  // rows per KV head, in the item
  const index_t n = rp.k_lens[static_cast<std::size_t>(s)], r0 = rp.row0(s);
  const index_t ldq = padded_stride(std::max<index_t>(D, 1));
  const index_t ldo = padded_stride(std::max<index_t>(Dv, 1));
  const index_t lds = padded_stride(ragged_key_tile);
  const index_t tiles = (n + ragged_key_tile - 1) / ragged_key_tile;
  // Keys of one run are ld elements apart: within a page (paged), or a whole slot
  // (contiguous); a run ends at a page boundary or at the tile's end.
  const index_t ldk = rows.k_ld(), ldv = rows.v_ld(), run_keys = rows.run_keys();

  ragged_scratch& w = ragged_scratch_for_thread();
  const auto rr = static_cast<std::size_t>(R), hh = static_cast<std::size_t>(heads);
  w.q.reserve(rr * static_cast<std::size_t>(ldq));
  w.o.reserve(rr * static_cast<std::size_t>(ldo));
  w.s.reserve(rr * static_cast<std::size_t>(lds));
  if (is_int8_kv<T>) {
    w.p8.reserve(rr * static_cast<std::size_t>(lds));
    w.scales.reserve(static_cast<std::size_t>(2 * ragged_key_tile));
  }
  const bool gemm = Rg >= ragged_gemm_rows;
  if (gemm) {
    w.kt.reserve(static_cast<std::size_t>(ragged_key_tile * ldq));
    w.kc.reserve(static_cast<std::size_t>(D * lds));
  }
  if (gemm || careful) w.vt.reserve(static_cast<std::size_t>(ragged_key_tile * ldo));
  w.qnorm.reserve(rr);
  w.state.reserve(rr);
  w.frames.reserve(rr);
  w.q_rows.reserve(rr);
  w.s_rows.reserve(rr);
  w.p_rows.reserve(rr);
  w.o_rows.reserve(rr);
  w.head_tiles.reserve(3 * hh);
  // Only the in-place int8 scores need it: the GEMM path widens K (k_q x scale) first.
  const bool prescale = is_int8_kv<T> && !gemm;
  if (prescale) w.q_exp.reserve(rr);

  // Row r is KV head g0 + r / Rg, position i0 + (r % Rg) / G, query head (g0 + r / Rg) G +
  // r % G. Per head: its tiles [first, last) and whether the walk is done with it.
  index_t* const first = w.head_tiles.data();
  index_t* const last = first + heads;
  index_t* const done = last + heads;
  index_t item_first = tiles, item_last = 0;
  for (index_t u = 0; u < heads; ++u) {
    index_t kmin = n, kmax = 0;  // the keys any of the head's rows may see
    for (index_t r = u * Rg; r < (u + 1) * Rg; ++r) {
      const index_t i = i0 + (r % Rg) / G, h = (g0 + u) * G + r % G;
      const float* src = q.ptr(r0 + i, h);
      float* dst = w.q.data() + r * ldq;
      std::copy(src, src + D, dst);
      if (prescale) w.q_exp[r] = prescale_int8_query(dst, D);
      std::fill(w.o.data() + r * ldo, w.o.data() + r * ldo + Dv, 0.0f);
      w.state[r] = softmax_state{};
      w.frames[r] = make_row_frame(p, s, h, i);
      w.q_rows[r] = dst;
      w.o_rows[r] = w.o.data() + r * ldo;
      if (w.frames[r].begin < w.frames[r].end) {
        kmin = std::min(kmin, w.frames[r].begin);
        kmax = std::max(kmax, w.frames[r].end);
      }
    }
    first[u] = kmin < kmax ? kmin / ragged_key_tile : 0;
    last[u] = kmin < kmax ? (kmax - 1) / ragged_key_tile + 1 : 0;
    done[u] = last[u] <= first[u];
    if (!done[u]) {
      item_first = std::min(item_first, first[u]);
      item_last = std::max(item_last, last[u]);
    }
  }

  // norm_prefix: this sequence's (kv_heads, tiles) prefix maxima (ragged_norms), or null.
  const bool skipping = p.skips_far_tiles(tiles) && norm_prefix != nullptr;
  if (skipping) {
    for (index_t r = 0; r < R; ++r) {
      // An upper bound on |q|: the norm in double, rounded up.
      double sq = 0;
      for (index_t e = 0; e < D; ++e) sq += double(w.q[r * ldq + e]) * double(w.q[r * ldq + e]);
      w.qnorm[r] =
          static_cast<float>(std::ldexp(std::sqrt(sq) * (1 + 1e-6), prescale ? w.q_exp[r] : 0));
    }
  }
  // Whether every row of head u may leave the keys left of x (the tiles from t down) out.
  auto negligible = [&](index_t u, index_t t, index_t x) {
    for (index_t r = u * Rg; r < (u + 1) * Rg; ++r) {
      const row_frame& f = w.frames[r];
      far_row fr;
      fr.t0 = f.t0;
      fr.begin = f.begin;
      fr.end = f.end;
      fr.shift = f.shift;
      fr.qnorm = w.qnorm[r];
      fr.state = w.state[r];
      if (!left_negligible(far_tile_bound::make(p.scale, f.slope), fr,
                           norm_prefix[(g0 + u) * tiles + t], x))
        return false;
    }
    return true;
  };
  auto nothing = [] {};
  // Requests the K and V rows of head u's keys [a, b) while another head's are computed:
  // with pages, a KV head's rows are a page's stride apart, which the hardware prefetcher
  // does not follow. One head's tile ahead: all heads' next tile would not fit in L2.
  auto request = [&](index_t u, index_t a, index_t b) {
    const auto kb = static_cast<index_t>(D * sizeof(T)), vb = static_cast<index_t>(Dv * sizeof(T));
    for (index_t j = a; j < b; ++j) {
      const char* kr = reinterpret_cast<const char*>(rows.k(s, g0 + u, j));
      const char* vr = reinterpret_cast<const char*>(rows.v(s, g0 + u, j));
      for (index_t l = 0; l < kb; l += 64) __builtin_prefetch(kr + l, 0, 3);
      for (index_t l = 0; l < vb; l += 64) __builtin_prefetch(vr + l, 0, 3);
      asm volatile("");  // keeps every request (kv_tiles.hpp says why)
    }
  };

  // Nearest tiles first: bottom-right aligned rows see their nearest keys last in the
  // sequence, so the walk goes from the last tile down, and leaves a head once everything
  // left of the tile is negligible for all of its rows.
  for (index_t t = item_last; t-- > item_first;) {
    const index_t t0 = t * ragged_key_tile, t1 = std::min(t0 + ragged_key_tile, n);
    index_t active = 0;
    for (index_t u = 0; u < heads; ++u) {
      if (done[u] || t >= last[u]) continue;
      if (t < first[u]) {
        done[u] = 1;
        continue;
      }
      if (skipping && t + 1 < last[u] && negligible(u, t, t1)) {
        skipped += t + 1 - first[u];
        done[u] = 1;
        continue;
      }
      ++active;
      ++computed;
      // The next head's rows of this tile, or the first head's of the next tile.
      if (u + 1 < heads)
        request(u + 1, t0, t1);
      else if (t > item_first)
        request(0, std::max(t0 - ragged_key_tile, index_t(0)), t0);
      const index_t g = g0 + u, c = t1 - t0;
      const float* const* qr = w.q_rows.data() + u * Rg;
      float* const* orows = w.o_rows.data() + u * Rg;
      if (gemm) {
        // S = Q K^T through a widened copy of the tile (int8 scales applied in the copy).
        for (index_t j = 0; j < c; ++j) {
          widen_row(rows.k(s, g, t0 + j), is_int8_kv<T> ? rows.k_scale(s, g, t0 + j) : 1.0f,
                    w.kt.data() + j * ldq, D);
          widen_row(rows.v(s, g, t0 + j), is_int8_kv<T> ? rows.v_scale(s, g, t0 + j) : 1.0f,
                    w.vt.data() + j * ldo, Dv);
        }
        // S^T (c, Rg) = K Q^T by the register-blocked tile_product, vectorized across the
        // keys: its columns are the rows of the row-major S, and Q's rows are read in place.
        pack_columns(w.kt.data(), ldq, c, D, packet_rows(c), w.kc.data(), lds);
        tile_product<false, true>(c, Rg, D, w.kc.data(), lds, w.q.data() + u * Rg * ldq, ldq,
                                  w.s.data() + u * Rg * lds, lds, nullptr, true);
      } else {
        // S = Q K^T, run by run, each score summed in an order of its own (small_rows.hpp):
        // the same bits whatever the runs, so pages of any size give the contiguous result.
        for (index_t j = t0; j < t1;) {
          const index_t je = std::min(t1, (j / run_keys + 1) * run_keys);
          for (index_t r = 0; r < Rg; ++r) w.s_rows[r] = w.s.data() + (u * Rg + r) * lds + (j - t0);
          small_scores(qr, Rg, rows.k(s, g, j), ldk, je - j, D, w.s_rows.data(), nothing);
          j = je;
        }
      }
      if (is_int8_kv<T> && !gemm) {
        // int8: q . (k_q * scale) = (q . k_q) * scale, one scale per score.
        for (index_t j = 0; j < c; ++j) {
          w.scales[j] = rows.k_scale(s, g, t0 + j);
          w.scales[ragged_key_tile + j] = rows.v_scale(s, g, t0 + j);
        }
        for (index_t r = u * Rg; r < (u + 1) * Rg; ++r) {
          float* x = w.s.data() + r * lds;
          for (index_t j = 0; j < c; ++j) x[j] *= w.scales[j];
          if (const int k = w.q_exp[r])
            for (index_t j = 0; j < c; ++j) x[j] = std::ldexp(x[j], k);
        }
      }
      for (index_t r = u * Rg; r < (u + 1) * Rg; ++r) {
        const row_frame& f = w.frames[r];
        float* x = w.s.data() + r * lds;
        const index_t vb = clamp_index(f.begin - t0, 0, c), ve = clamp_index(f.end - t0, 0, c);
        // Distances |q_pos - k_pos| - shift = |base - j| - shift, exact in float (< 2^24).
        const float mx = score_row(x, c, vb, ve, p.scale * log2e_f, -f.slope * log2e_f,
                                   static_cast<float>(f.t0 - t0), static_cast<float>(f.shift));
        const softmax_step step = w.state[r].rescale(mx);
        w.state[r].add(step, exp_row(x, c, step.ref));
        if (step.factor != 1.0f)
          for (index_t e = 0; e < Dv; ++e) w.o_rows[r][e] *= step.factor;
        if (is_int8_kv<T> && !gemm) {
          // int8 V: p (v_q * scale) = (p * scale) v_q; the row's sum above keeps p itself.
          float* y = w.p8.data() + r * lds;
          for (index_t j = 0; j < c; ++j) y[j] = x[j] * w.scales[ragged_key_tile + j];
        }
      }
      if (careful) {
        // One key at a time over the row's own keys: through the products, the row's
        // probability 0 for a key it does not see would meet that key's V as 0 x NaN.
        for (index_t r = u * Rg; r < (u + 1) * Rg; ++r) {
          const row_frame& f = w.frames[r];
          const index_t vb = clamp_index(f.begin - t0, 0, c), ve = clamp_index(f.end - t0, 0, c);
          const float* x = w.s.data() + r * lds;
          for (index_t j = vb; j < ve; ++j) {
            widen_row(rows.v(s, g, t0 + j), is_int8_kv<T> ? rows.v_scale(s, g, t0 + j) : 1.0f,
                      w.vt.data(), Dv);
            for (index_t e = 0; e < Dv; ++e) w.o_rows[r][e] += x[j] * w.vt[e];
          }
        }
      } else if (gemm) {
        // O^T (Dv, Rg) += V^T P^T, vectorized across the head dimension: the widened V rows
        // are V^T's columns, and P's rows are read in place.
        tile_product<true, true>(Dv, Rg, c, w.vt.data(), ldo, w.s.data() + u * Rg * lds, lds,
                                 w.o.data() + u * Rg * ldo, ldo, nullptr, true);
      } else {
        // O += P V, run by run, each output element summing its keys in ascending order.
        float* const pbase = is_int8_kv<T> ? w.p8.data() : w.s.data();
        for (index_t j = t0; j < t1;) {
          const index_t je = std::min(t1, (j / run_keys + 1) * run_keys);
          for (index_t r = 0; r < Rg; ++r) w.p_rows[r] = pbase + (u * Rg + r) * lds + (j - t0);
          small_pv(w.p_rows.data(), Rg, rows.v(s, g, j), ldv, je - j, Dv, nullptr, 0, orows,
                   nothing);
          j = je;
        }
      }
    }
    if (active == 0) break;
  }

  for (index_t r = 0; r < R; ++r) {
    const index_t i = i0 + (r % Rg) / G, h = (g0 + r / Rg) * G + r % G;
    const float inv = w.state[r].inverse_sum();
    float* dst = out.ptr(r0 + i, h);
    for (index_t e = 0; e < Dv; ++e) dst[e] = w.o_rows[r][e] * inv;
    if (rp.lse.data)
      rp.lse(0, h, r0 + i) =
          w.state[r].lse(-w.frames[r].slope * static_cast<float>(w.frames[r].shift));
  }
}

/// The ragged call on `threads` threads: one item per (sequence, KV head, chunk of
/// positions), each computed by one thread, so results do not depend on the thread count.
template <class KV>
void ragged_kernel(int threads, const ragged_problem& rp, const tensor_view<const float, 3>& q,
                   const KV& kv, const tensor_view<float, 3>& out) {
  struct item {
    index_t s, g0, g1, i0, i1;
  };
  const attention_problem& p = rp.p;
  auto per = [&](index_t s) {
    return ragged_positions_per_item(p.group_size(), rp.q_lens[static_cast<std::size_t>(s)]);
  };
  index_t units = 0;  // (sequence, chunk of positions) pairs
  for (index_t s = 0; s < rp.num_seqs(); ++s)
    units += (rp.q_lens[static_cast<std::size_t>(s)] + per(s) - 1) / per(s);
  // KV heads per item: all of them where the units alone make about 16 items, fewer where
  // they do not (one long sequence), so that the threads have work to share.
  const index_t hb = std::max<index_t>(1, std::min<index_t>(p.kv_heads, p.kv_heads * units / 16));
  std::vector<item> items;
  for (index_t s = 0; s < rp.num_seqs(); ++s)
    for (index_t g = 0; g < p.kv_heads; g += hb)
      for (index_t i0 = 0; i0 < rp.q_lens[static_cast<std::size_t>(s)]; i0 += per(s))
        items.push_back({s, g, std::min(g + hb, p.kv_heads), i0,
                         std::min(i0 + per(s), rp.q_lens[static_cast<std::size_t>(s)])});
  // The key-norm prefixes of far-tile skipping, once per call for every sequence with rows:
  // one pass over each sequence's pages (a pass per work item cost a 128k-token step more
  // than the tiles it read).
  std::vector<index_t> prefix_at(static_cast<std::size_t>(rp.num_seqs()), -1);
  std::vector<float> prefix, running(static_cast<std::size_t>(p.kv_heads));
  if (p.skip_far_tiles && p.slopes.enabled && ragged_norms<KV>::has(kv, p)) {
    index_t size = 0;
    for (index_t s = 0; s < rp.num_seqs(); ++s)
      if (rp.q_lens[static_cast<std::size_t>(s)] > 0) {
        prefix_at[static_cast<std::size_t>(s)] = size;
        size += p.kv_heads *
                ((rp.k_lens[static_cast<std::size_t>(s)] + ragged_key_tile - 1) / ragged_key_tile);
      }
    prefix.resize(static_cast<std::size_t>(size));
    for (index_t s = 0; s < rp.num_seqs(); ++s)
      if (prefix_at[static_cast<std::size_t>(s)] >= 0)
        ragged_norms<KV>::fill(kv, p, s, rp.k_lens[static_cast<std::size_t>(s)], running.data(),
                               prefix.data() + prefix_at[static_cast<std::size_t>(s)]);
  }
  std::atomic<std::int64_t> computed{0}, skipped{0};
  // Whether KV head g's output rows and logsumexps in an item are all finite: finite inputs
  // always give finite results, so otherwise that head is computed again on the careful
  // path. Per head, so that which heads share an item (it depends on the whole batch)
  // changes no bit of a head's result.
  auto head_finite = [&](const item& it, index_t g) {
    const index_t G = p.group_size(), r0 = rp.row0(it.s);
    for (index_t i = it.i0; i < it.i1; ++i)
      for (index_t h = g * G; h < (g + 1) * G; ++h) {
        if (!all_finite(out.ptr(r0 + i, h), 0, 1, p.v_head_dim)) return false;
        if (rp.lse.data && std::isnan(rp.lse(0, h, r0 + i))) return false;
      }
    return true;
  };
  parallel_for(resolve_threads(threads), static_cast<index_t>(items.size()), [&](index_t k) {
    const item& it = items[static_cast<std::size_t>(k)];
    std::int64_t c = 0, sk = 0;
    const index_t at = prefix_at[static_cast<std::size_t>(it.s)];
    const float* norms = at >= 0 ? prefix.data() + at : nullptr;
    ragged_item(rp, q, kv, out, norms, it.s, it.g0, it.g1, it.i0, it.i1, false, c, sk);
    for (index_t g = it.g0; g < it.g1; ++g)
      if (!head_finite(it, g)) {
        // The head's tiles are counted once, by its careful pass: take back its first
        // pass's count (the same tiles, counted by a pass over this head alone).
        std::int64_t c1 = 0, sk1 = 0;
        ragged_item(rp, q, kv, out, norms, it.s, g, g + 1, it.i0, it.i1, false, c1, sk1);
        c -= c1;
        sk -= sk1;
        ragged_item(rp, q, kv, out, norms, it.s, g, g + 1, it.i0, it.i1, true, c, sk);
      }
    computed += c;
    skipped += sk;
  });
  if (p.stats) {
    p.stats->tiles_computed += computed.load();
    p.stats->tiles_skipped += skipped.load();
  }
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu

template <>
struct ragged_impl<backend::eigen> {
  template <class TQ, class T, class TO>
  static constexpr bool implemented =
      std::is_same<TQ, float>::value&& std::is_same<TO, float>::value &&
      (cpu::is_cpu_kv_type<T> || is_int8_kv<T>);

  template <class TQ, class T, class TO>
  static status can_implement(const backend::eigen& be, const ragged_problem&) {
    if (status s = threads_status(be.threads); !s) return s;
    if (!implemented<TQ, T, TO>)
      return status::failure(
          "alibi::ragged_attention (eigen): q and out must be float, K/V float, Eigen::half, "
          "Eigen::bfloat16 or std::int8_t (use alibi::backend::reference for double)");
    return {};
  }

  template <class TQ, class KV, class TO>
  static void run(const backend::eigen& be, const ragged_problem& rp, tensor_view<const TQ, 3> q,
                  const KV& kv, tensor_view<TO, 3> out) {
    if constexpr (implemented<TQ, typename kv_element<KV>::type, TO>)
      cpu::ragged_kernel(be.threads, rp, q, kv, out);
  }
};

}  // namespace detail
}  // namespace alibi
