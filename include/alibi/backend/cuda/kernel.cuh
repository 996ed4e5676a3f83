// SPDX-License-Identifier: MIT
// The fused forward kernel of the CUDA backend (flash-attention style). One block handles
// block_m query rows of one (batch, kv head): the rows of every query head of that kv head's
// group, interleaved (packed row r = query i * group + head g), so that each K/V tile staged
// in shared memory serves the whole GQA group.
//
// attention_kernel is a prologue (where the block sits, the keys its rows may see, each
// thread's rows, and the steps below as lambdas over those values), one of two tile walks,
// and the epilogue (finish_rows, epilogue.cuh):
//  - dense_walk visits every key tile, from the last (nearest to causal queries) to the first;
//  - skip_walk (the Skip instances) visits them nearest-first and stops a side once the ALiBi
//    bound (numerics/far_tiles.hpp, far_skip.cuh) shows the rest of it negligible for every
//    row of the block.
// A walk decides the order of the tiles, the double-buffered staging and the barriers; the
// kernel's steps do the work (lambdas; per tile: tile_steps.cuh). The walks and helpers
// here are __forceinline__ and the steps stay lambdas of the kernel, so that after inlining
// the kernel is the same single function, with the same code, as one written in one body.
#pragma once

#include <cstdint>

#include "alibi/backend/cuda/epilogue.cuh"
#include "alibi/backend/cuda/far_skip.cuh"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/backend/cuda/tile_steps.cuh"
#include "alibi/backend/cuda/traits.cuh"
#include "alibi/core/problem.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

/// Where a block's rows are: batch b, the packed rows [row0, row0 + block_m) of the
/// packed_rows (q_len * group), and the batch's query and key lengths.
struct block_rows {
  index_t b = 0, row0 = 0, packed_rows = 0, group = 1, lq = 0, lk = 0;
};

/// The queries of a block's packed rows that exist (below the batch's query length),
/// [first, last] (none when first > last), and the key ranges of those two. The positional
/// key ranges are monotone in the query position, so these two bound every row's.
struct block_queries {
  index_t first = 0, last = -1;
  index_range first_keys{}, last_keys{};

  __device__ __forceinline__ bool empty() const { return first > last; }
};

/// The block_queries of a block's rows.
template <class Tr>
__device__ __forceinline__ block_queries queries_of_block(const attention_problem& p,
                                                          const block_rows& br) {
  const index_t b = br.b, row0 = br.row0, packed_rows = br.packed_rows, group = br.group;
  const index_t lq = br.lq;
  block_queries q;
  q.first = row0 / group;
  const index_t last_row =
      (row0 + Tr::block_m < packed_rows ? row0 + Tr::block_m : packed_rows) - 1;
  q.last = last_row / group < lq ? last_row / group : lq - 1;
  if (!q.empty()) {
    q.first_keys = p.key_range(b, q.first);
    q.last_keys = p.key_range(b, q.last);
  }
  return q;
}

/// The key tiles of a block: the keys [key_lo, key_hi) that some row of the block may see
/// within its split's chunk, and their tiles [tile_first, tile_end) (tile_end == tile_first:
/// none).
struct block_tiles {
  index_t key_lo = 0, key_hi = 0, tile_first = 0, tile_end = 0;
};

// The walks are generic over the steps they drive: lambdas of the kernel over its
// prologue's values, passed one by one. (Bundling them in a struct of references, or moving
// skip_walk's anchor step into a helper with its own locals, changes the order of the code
// the compiler generates, and with it the SASS; written this way it is the same.)
//  - stage_q(): stages the block's query rows into shared memory;
//  - stage_tile(t, buf, values): stages key tile t (K, and V when `values`) into buffer buf;
//  - load_q(): this warp's Q fragments into registers (nothing unless Tr::q_in_regs);
//  - compute_tile(t, buf): S = Q K^T, bias and masks, online softmax and O += P V of key
//    tile t, staged in buffer buf (warp-wide: only warps with rows call it);
// and, for skip_walk:
//  - row_info(): far_row_info of the staged Q rows into the block's skip_smem;
//  - anchor_scores(acc_s, t): the warp's base-2 scores of key tile t, staged in buffer 0
//    (bias and masks applied; O and the row states untouched);
//  - search(states, parity, cut, tl, tr): search_cuts with the rows' states `states`.
// Staging is block-wide; the walk commits and waits for the copies and places the barriers.

/// The dense walk: every key tile of the block, from the last to the first, the next tile
/// staged (two buffers) while this one is computed. Block-wide. Returns the number of tiles
/// computed.
template <class Tr, class StageQ, class StageTile, class LoadQ, class ComputeTile>
__device__ __forceinline__ index_t dense_walk(const block_tiles& kt, bool warp_active,
                                              const StageQ& stage_q, const StageTile& stage_tile,
                                              const LoadQ& load_q,
                                              const ComputeTile& compute_tile) {
  const index_t tile_first = kt.tile_first, tile_end = kt.tile_end;
  const index_t computed = tile_end - tile_first;
  if (tile_end > tile_first) {
    stage_q();
    stage_tile(tile_end - 1, static_cast<int>((tile_end - 1) & 1), true);
    cp_async_commit();
  }
  for (index_t t = tile_end - 1; t >= tile_first; --t) {
    const int buf = static_cast<int>(t & 1);
    // Prefetch the next tile into the other buffer (free: every warp passed the barrier at
    // the end of the previous iteration), then wait for this one only.
    if (t > tile_first) {
      stage_tile(t - 1, static_cast<int>((t - 1) & 1), true);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile t (and Q) have landed for every thread
    if (!warp_active) {
      __syncthreads();
      continue;
    }
    if (t == tile_end - 1) load_q();
    compute_tile(t, buf);
    __syncthreads();  // every warp is done with buffer t % 2 before it is refilled
  }
  return computed;
}

/// Where skip_walk starts: the block's nearest key near_all and the middle row's query
/// position t0_mid (relative to key 0), whose distance to a tile orders the walk.
struct walk_origin {
  index_t near_all = 0;
  std::int32_t t0_mid = 0;
};

/// The walk_origin of the block: for the middle row's query position, the nearest key that
/// every row of the block may see (so that the first tile gives every row some weight: under
/// a causal mask, the first row's own position), else the nearest key of any row.
template <class Tr>
__device__ __forceinline__ walk_origin origin_of_walk(const attention_problem& p,
                                                      const block_rows& br) {
  const index_t b = br.b, lk = br.lk;
  const block_queries bq = queries_of_block<Tr>(p, br);
  walk_origin o;
  if (!bq.empty()) {
    const index_range r0 = bq.first_keys, r1 = bq.last_keys;
    const index_t all_lo = r0.begin, all_hi = r1.end < lk ? r1.end : lk;
    index_t lo = r1.begin > all_lo ? r1.begin : all_lo, hi = r0.end < all_hi ? r0.end : all_hi;
    if (lo >= hi) lo = all_lo, hi = all_hi;
    const index_t mid = p.q_offset(b) + (bq.first + bq.last) / 2 - p.k_offset(b);
    o.near_all = mid < lo ? lo : mid >= hi ? hi - 1 : mid;
    // Only the order of the tiles depends on it: clamped to 32 bits (keys below 2^28).
    o.t0_mid =
        static_cast<std::int32_t>(detail::clamp_index(mid, -(index_t(1) << 30), index_t(1) << 30));
  }
  return o;
}

/// The walk with far-tile skipping (Skip instances): the tiles are visited nearest-first
/// from the tile of the block's nearest key (walk_origin), and at a few points (after 1, 2,
/// 4, 8, ... computed tiles) the block searches how far each side must go (search_cuts);
/// between the searches the walk runs like the dense one. `st`: the rows' softmax states,
/// which the searches read. Block-wide. Returns the number of tiles computed.
template <class Tr, class StageQ, class StageTile, class LoadQ, class ComputeTile, class RowInfo,
          class AnchorScores, class Search>
__device__ __forceinline__ index_t
skip_walk(const attention_problem& p, const block_rows& br, const block_tiles& kt, bool warp_active,
          const row_states<Tr>& st, const StageQ& stage_q, const StageTile& stage_tile,
          const LoadQ& load_q, const ComputeTile& compute_tile, const RowInfo& row_info,
          const AnchorScores& anchor_scores, const Search& search) {
  constexpr int BN = Tr::block_n;
  const index_t key_lo = kt.key_lo, key_hi = kt.key_hi;
  index_t computed = 0;
  bool info_ready = false;
  int searches = 0;
  tile_cuts cut{static_cast<std::int32_t>(kt.tile_first), static_cast<std::int32_t>(kt.tile_end)};
  const walk_origin org = origin_of_walk<Tr>(p, br);
  const index_t near_all = org.near_all;
  const std::int32_t t0_mid = org.t0_mid;
  std::int32_t center = static_cast<std::int32_t>(kt.tile_end - 1);
  if (kt.tile_end > kt.tile_first) {
    center = static_cast<std::int32_t>((near_all < key_lo    ? key_lo
                                        : near_all >= key_hi ? key_hi - 1
                                                             : near_all) /
                                       BN);
    if (near_all < key_lo || near_all >= key_hi) {
      // A chunk on one side of the rows' nearest key (a far chunk of split-KV): its own
      // state is empty, so the scores of the tile nearest the rows (the anchor, scores only,
      // not counted as computed) may show the whole chunk, or its far part, negligible; what
      // is, is never read.
      const index_t ta = near_all / BN;
      row_states<Tr> anchor;
      stage_q();
      stage_tile(ta, 0, false);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
      row_info();
      if (warp_active) {
        load_q();
        score_acc<Tr> acc_s;
        anchor_scores(acc_s, ta);
        tile_states<Tr>(acc_s, anchor);
      } else {
#pragma unroll
        for (int s = 0; s < Tr::rows_per_thread; ++s) anchor[s] = softmax_state{};
      }
      __syncthreads();  // s_info is complete, and buffer 0 is free again
      info_ready = true;
      // Nothing of the chunk is computed yet: the walk would start at its near end. Each side
      // test bounds the whole tail of that side beyond its point (every key at that distance
      // or more), not only this chunk's keys, so the weight all the chunks and tiles skipped
      // on one side is at most the tail of the nearest point skipped there: the bounds nest
      // rather than add up.
      const std::int32_t tl = near_all >= key_hi ? cut.hi : cut.lo;
      cut = search(anchor, searches++ & 1, cut, tl, tl - 1);
      center = near_all >= key_hi ? cut.hi - 1 : cut.lo;
    }
  }
  // Distance from t0_mid to the keys of tile u: the walk's order.
  auto gap = [&](std::int32_t u) {
    const std::int32_t first = u * BN, last = first + BN - 1;
    return first > t0_mid ? first - t0_mid : last < t0_mid ? t0_mid - last : 0;
  };
  std::int32_t t = cut.lo < cut.hi ? center : -1;
  std::int32_t tl = t, tr = t;  // the walk's extent: tiles computed or staged
  if (t >= 0) {
    if (!info_ready) stage_q();  // else the anchor staged Q
    stage_tile(t, 0, true);
    cp_async_commit();
  }
  for (int buf = 0; t >= 0; buf ^= 1) {
    // A search once 1, 2, 4, ... tiles are done (with the rows' states after them), at the
    // top of an iteration: every warp has passed the previous iteration's last barrier.
    if (info_ready && computed > 0 && (computed & (computed - 1)) == 0)
      cut = search(st, searches++ & 1, cut, tl, tr);
    // The next tile, the nearer of the two sides' next ones, staged into the other buffer
    // (free: every warp passed the barrier at the end of the previous iteration).
    const bool can_left = tl - 1 >= cut.lo, can_right = tr + 1 < cut.hi;
    std::int32_t next = -1;
    if (can_left && (!can_right || gap(tl - 1) <= gap(tr + 1)))
      next = tl = tl - 1;
    else if (can_right)
      next = tr = tr + 1;
    if (next >= 0) {
      stage_tile(next, buf ^ 1, true);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile t (and Q) have landed for every thread
    if (!info_ready) {
      row_info();  // visible to every thread after this iteration's last barrier
      info_ready = true;
    }
    ++computed;
    if (warp_active) {
      if (computed == 1) load_q();
      compute_tile(t, buf);
    }
    __syncthreads();  // every warp is done with buffer buf before it is refilled
    t = next;
  }
  return computed;
}

/// The fused forward kernel: the prologue, the dense or the skipping walk over the block's
/// key tiles, the params.stats counters, and the epilogue (finish_rows).
template <class Tr>
__global__ void __launch_bounds__(Tr::threads, Tr::min_blocks)
    attention_kernel(const fwd_args<typename Tr::element> a) {
  using T = typename Tr::element;
  constexpr int BM = Tr::block_m, BN = Tr::block_n, LD = Tr::ld;
  constexpr int DT = Tr::d_tiles, MI = Tr::m_tiles, WR = Tr::warp_rows;
  constexpr int KW = Tr::key_warps, R = Tr::rows_per_thread;
  const float neg_inf = detail::neg_inf_f();
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_q = reinterpret_cast<T*>(smem);                             // (BM, LD) query rows
  T* s_k0 = s_q + BM * LD;                                         // 2 x (BN, LD) key tiles
  T* s_v0 = s_k0 + 2 * BN * LD;                                    // 2 x (BN, LD) value tiles
  float* s_flags0 = reinterpret_cast<float*>(s_v0 + 2 * BN * LD);  // 2 x (BN) 0 / -inf (key mask)
  float* s_p = s_flags0 + 2 * BN;                                  // (BM, p_ld) fp32 P (FMA path)

  const attention_problem& p = a.p;
  const index_t group = p.group_size();
  // Block -> (row tile, batch x kv head, split), the row tiles with the most keys (the
  // last ones under a causal mask) first.
  index_t bx = blockIdx.x;
  const index_t split = bx % a.splits;
  bx /= a.splits;
  const index_t bh = bx % (p.batch * p.kv_heads);
  const index_t rt = a.row_tiles - 1 - bx / (p.batch * p.kv_heads);
  const index_t b = bh / p.kv_heads, kvh = bh % p.kv_heads;
  const index_t row0 = rt * BM, packed_rows = p.q_len * group;
  const index_t lq = p.len_q(b), lk = p.len_k(b);
  const block_rows br{b, row0, packed_rows, group, lq, lk};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  // Warps split the rows, or (decoding) each key tile: wrow is the warp's row group, koff
  // the first of its keys within a tile.
  const int wrow = warp / KW, koff = (warp % KW) * Tr::warp_keys;
  const bool has_key_mask = p.key_mask.data != nullptr;
  const row_writer<T> writer{a, split, b};

  // This thread's rows (see warp_row_map), their 32-bit frames (registers are scarce),
  // softmax states and slopes.
  const warp_row_map rows{row0 + wrow * WR, packed_rows, group, kvh};
  row_frames<Tr> fr;
  row_states<Tr> st;
  row_values<Tr> neg_slope_l2;
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const index_t r = rows.row(s, lane / 4);
    const row_frame f =
        r < packed_rows ? detail::make_row_frame(p, b, rows.head(r), rows.query(r)) : row_frame{};
    fr[s] = detail::make_row_frame32(f);
    neg_slope_l2[s] = -f.slope * detail::log2e_f;
  }
  const float scale_l2 = p.scale * detail::log2e_f;

  // Keys any row of the block may see, within this split's chunk.
  index_t key_lo = split * a.chunk, key_hi = key_lo + a.chunk;
  {
    const block_queries bq = queries_of_block<Tr>(p, br);
    if (bq.empty()) {
      key_hi = key_lo;
    } else {
      key_lo = key_lo > bq.first_keys.begin ? key_lo : bq.first_keys.begin;
      key_hi = key_hi < bq.last_keys.end ? key_hi : bq.last_keys.end;
      key_hi = key_hi < lk ? key_hi : lk;
    }
  }
  const index_t tile_first = key_lo / BN;
  const index_t tile_end = key_hi > key_lo ? (key_hi + BN - 1) / BN : tile_first;
  const block_tiles kt{key_lo, key_hi, tile_first, tile_end};

  out_acc<Tr> acc_o;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][n][e] = 0.0f;

  auto q_row = [&](int r) -> const T* {
    const index_t pr = row0 + r, i = pr / group;
    return pr < packed_rows && i < lq ? a.q.ptr(b, kvh * group + pr % group, i) : nullptr;
  };
  // This block's K and V rows: key j at base + j * stride.
  const T* const k_base = a.k.ptr(b, kvh);
  const T* const v_base = a.v.ptr(b, kvh);
  const index_t k_stride = a.k.strides[2], v_stride = a.v.strides[2];
  // Stages key tile t (K, V unless !values, and the key-mask flags) into buffer buf. Keys
  // past the length and keys the mask excludes are zero-filled, never read.
  auto stage_tile = [&](index_t t, int buf, bool values) {
    const index_t j0 = t * BN;
    auto key_row = [&](const T* base, index_t stride) {
      return [=, &p](int r) -> const T* {
        const index_t j = j0 + r;
        return j < lk && !(has_key_mask && p.key_mask(b, j)) ? base + j * stride : nullptr;
      };
    };
    stage_rows<Tr>(s_k0 + buf * BN * LD, BN, a.aligned, key_row(k_base, k_stride));
    if (values) stage_rows<Tr>(s_v0 + buf * BN * LD, BN, a.aligned, key_row(v_base, v_stride));
    if (has_key_mask)
      for (int r = threadIdx.x; r < BN; r += Tr::threads)
        s_flags0[buf * BN + r] = j0 + r < lk && p.key_excluded(b, j0 + r) ? neg_inf : 0.0f;
  };
  // Warps whose rows are all padding skip the arithmetic (decoding fills one warp).
  bool has_rows = false;
#pragma unroll
  for (int s = 0; s < R; ++s) has_rows = has_rows || fr[s].end > fr[s].begin;
  const bool warp_active = __any_sync(0xffffffffu, has_rows);
  const T* s_qw = s_q + wrow * WR * LD;  // this warp's query rows

  q_fragments<Tr> q_frag;

  // S = Q K^T, the bias and masks, the online softmax and O += P V for key tile t, staged in
  // buffer buf.
  auto compute_tile = [&](index_t t, int buf) {
    const std::int32_t j0 = static_cast<std::int32_t>(t * BN);  // k_len < 2^28
    const T* s_k = s_k0 + buf * BN * LD;
    const T* s_v = s_v0 + buf * BN * LD;
    const float* s_flags = s_flags0 + buf * BN;
    score_acc<Tr> acc_s;
    compute_scores<Tr>(acc_s, s_qw, s_k, q_frag, koff, lane);  // S = Q K^T
    bias_and_masks<Tr>(acc_s, fr, j0, koff + 2 * tq, scale_l2, neg_slope_l2, has_key_mask,
                       s_flags);         // base-2 scores, -inf masked
    softmax_tile<Tr>(acc_s, acc_o, st);  // P, row states, O rescaled
    accumulate_pv<Tr>(acc_o, acc_s, s_v, s_p + wrow * WR * Tr::p_ld, koff, lane);  // O += P V
  };
  auto stage_q = [&] { stage_rows<Tr>(s_q, BM, a.aligned, q_row); };
  auto load_q = [&] {
    if constexpr (Tr::q_in_regs) load_q_fragments<Tr>(q_frag, s_qw, lane);
  };

  index_t computed = 0, skipped = 0;  // key tiles, for params.stats
  if constexpr (!Tr::skip) {
    computed = dense_walk<Tr>(kt, warp_active, stage_q, stage_tile, load_q, compute_tile);
  } else {
    // Far-tile skipping's shared memory follows the fp32 P tile.
    unsigned char* const skip_base = reinterpret_cast<unsigned char*>(s_p) + Tr::p_bytes;
    const skip_smem sk{reinterpret_cast<float4*>(skip_base),
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM),
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM) + BM,
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM) + 2 * BM};
    auto row_info = [&] { far_row_info<Tr>(a, b, kvh, row0, s_q, sk); };
    auto anchor_scores = [&](score_acc<Tr>& acc_s, index_t ta) {
      compute_scores<Tr>(acc_s, s_qw, s_k0, q_frag, koff, lane);
      bias_and_masks<Tr>(acc_s, fr, static_cast<std::int32_t>(ta * BN), koff + 2 * tq, scale_l2,
                         neg_slope_l2, has_key_mask, s_flags0);
    };
    auto search = [&](const row_states<Tr>& states, int parity, tile_cuts cut, std::int32_t tl,
                      std::int32_t tr) {
      return search_cuts<Tr>(a, rows, b, row0, fr, states, sk, parity, cut, tl, tr);
    };
    computed = skip_walk<Tr>(p, br, kt, warp_active, st, stage_q, stage_tile, load_q, compute_tile,
                             row_info, anchor_scores, search);
    skipped = (kt.tile_end - kt.tile_first) - computed;
  }
  // params.stats: the anchor tile (scores only) is not counted, so that computed + skipped
  // is the dense count.
  if (a.counters != nullptr && threadIdx.x == 0) {
    atomicAdd(a.counters, static_cast<unsigned long long>(computed));
    if (skipped > 0) atomicAdd(a.counters + 1, static_cast<unsigned long long>(skipped));
  }

  finish_rows<Tr>(a, writer, st, acc_o, rows, reinterpret_cast<float*>(s_k0), computed == 0);
}

}  // namespace cuda_detail
}  // namespace alibi
