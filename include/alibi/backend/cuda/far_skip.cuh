// SPDX-License-Identifier: MIT
// Far-tile skipping in the forward kernel: each row's query-norm bound and ALiBi terms
// (far_row_info), the states the side tests start from (tile_states), and the block-wide
// search for the tiles every row of the block can leave out (search_cuts), read against the
// key-norm bounds of fwd_args::norm_prefix / norm_suffix. The side tests themselves are
// the shared ones of numerics/far_tiles.hpp, so every backend skips the same tiles.
#pragma once

#include <cstdint>

#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/backend/cuda/traits.cuh"
#include "alibi/core/problem.hpp"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

/// Far-tile skipping's shared memory: per packed row of the block its far_row_info and the
/// cuts its test proposes (search_cuts), and the block's cuts (two pairs, used alternately).
struct skip_smem {
  float4* info;          // (block_m)
  long long* row_lo;     // (block_m)
  long long* row_hi;     // (block_m)
  long long* block_cut;  // (2, 2): lo, hi
};

inline constexpr long long no_cut_lo = -(1LL << 62), no_cut_hi = 1LL << 62;

/// Far-tile skipping: each packed row's query-norm bound, slope and log-geometric term
/// (far_tile_bound::log_geo rounded up to float, NaN where the slope is not a finite positive
/// number: such rows never skip), from the staged Q rows into s_info (block_m rows; .w
/// unused), and the cut slots' initial values. Block-wide; the caller's next barrier makes
/// it visible.
template <class Tr>
__device__ void far_row_info(const fwd_args<typename Tr::element>& a, index_t b, index_t kvh,
                             index_t row0, const typename Tr::element* s_q, const skip_smem& sk) {
  using T = typename Tr::element;
  const attention_problem& p = a.p;
  const index_t group = p.group_size(), packed_rows = p.q_len * group, lq = p.len_q(b);
  for (int lr = threadIdx.x; lr < Tr::block_m; lr += Tr::threads) {
    const index_t r = row0 + lr;
    float4 info = make_float4(0.0f, 0.0f, detail::nan_f(), 0.0f);
    if (r < packed_rows && r / group < lq) {
      // 16-byte reads: with the padded row stride, the rows of 8 threads fall in different
      // bank groups. The order of the squares does not matter to key_norm_bound.
      float sq = 0.0f;
      for (int c = 0; c < Tr::head_dim; c += Tr::vec) {
        const int4 raw = *reinterpret_cast<const int4*>(s_q + lr * Tr::ld + c);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int u = 0; u < Tr::vec; ++u) {
          const float x = elem<T>::to_float(e[u]);
          sq = fmaf(x, x, sq);
        }
      }
      const float slope = p.slope(b, kvh * group + r % group);
      info.x = detail::key_norm_bound(sq, Tr::head_dim);
      info.y = slope;
      if (slope > 0.0f && isfinite(slope))
        info.z = __double2float_ru(detail::far_tile_bound::make(p.scale, slope).log_geo);
    }
    sk.info[lr] = info;
    sk.row_lo[lr] = no_cut_lo;
    sk.row_hi[lr] = no_cut_hi;
  }
  if (threadIdx.x < 2) {
    sk.block_cut[2 * threadIdx.x] = no_cut_hi;
    sk.block_cut[2 * threadIdx.x + 1] = no_cut_lo;
  }
}

/// The softmax state of this thread's columns of one tile's scores (base 2, bias and masks
/// applied), per row, with O untouched: the anchor tile's lower bound on each row's
/// normalizer (any subset of a row's keys gives one).
template <class Tr>
__device__ __forceinline__ void tile_states(const score_acc<Tr>& acc_s, row_states<Tr>& out) {
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    const int mi = s / 2, k = s % 2;
    float mx = detail::neg_inf_f();
#pragma unroll
    for (int n = 0; n < Tr::n_tiles; ++n)
      mx = fmaxf(mx, fmaxf(acc_s[mi][n][2 * k], acc_s[mi][n][2 * k + 1]));
    // One maximum per quad (as softmax_tile keeps it), so that block_negligible can add
    // the quad's sums.
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    softmax_state st;
    const detail::softmax_step step = st.rescale(mx);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < Tr::n_tiles; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) sum += detail::exp2_flush(acc_s[mi][n][2 * k + c] - step.ref);
    st.add(step, sum);
    out[s] = st;
  }
}

/// The tiles a skipping block still computes: [lo, hi) of its chunk's tiles; the others are
/// proven negligible for every row.
struct tile_cuts {
  std::int32_t lo = 0, hi = 0;  // tile indices (k_len < 2^28): 32-bit, registers are scarce
};

/// Far-tile skipping's cut search for the whole block (block-wide: every thread calls it).
/// The walk has computed (or staged) the tiles [tl, tr] (tr = tl - 1: none yet); `cut` are the
/// cuts so far. Returns them moved inwards as far as the shared side tests
/// (detail::left_negligible / right_negligible, the one test of every backend) prove for
/// every row of the block, with the rows' states `st` (each row's quad sum of its threads'
/// partial sums: the warp's columns of the tiles computed so far, or of the anchor tile, a
/// lower bound on the row's final normalizer). For each row, far_tile_bound::min_distance
/// proposes the tile boundary nearest the walk where its test can hold, and the test decides
/// there (or at the next boundary out); a row's proof by any warp that holds it counts (the
/// decoding instance's key warps hold disjoint columns of the same rows). Each thread of a
/// quad handles one row slot at a time (64-bit integer and double arithmetic): slots tq,
/// tq + 4, ... Asked at a few points of the walk rather than before every tile: between
/// them the walk runs like the dense loop, without tests or extra barriers.
template <class Tr>
__device__ tile_cuts search_cuts(const fwd_args<typename Tr::element>& a, const warp_row_map& rows,
                                 index_t b, index_t row0, const row_frames<Tr>& fr,
                                 const row_states<Tr>& st, const skip_smem& sk, int parity,
                                 tile_cuts cut, std::int32_t tl, std::int32_t tr) {
  constexpr int R = Tr::rows_per_thread, BN = Tr::block_n;
  const attention_problem& p = a.p;
  const int lane = threadIdx.x % 32;
  const float* prefix = a.norm_prefix + (b * p.kv_heads + rows.kv_head) * a.norm_grid;
  const float* suffix = a.norm_suffix + (b * p.kv_heads + rows.kv_head) * a.norm_grid;
  // The largest key-norm bound of the keys left of x (x >= 1) / from x on (x < k_len).
  auto kmax_left = [&](index_t x) { return prefix[(x - 1) / key_norm_block]; };
  auto kmax_right = [&](index_t x) { return suffix[x / key_norm_block]; };
  const bool search_lo = cut.lo < tl, search_hi = tr + 1 < cut.hi;
#pragma unroll
  for (int base = 0; base < R; base += 4) {
    const int mine = base + lane % 4;
    bool has_keys = false;  // whether row slot `mine` is a row with keys
    softmax_state own;
#pragma unroll
    for (int s = base; s < R && s < base + 4; ++s) {
      float l = st[s].l + __shfl_xor_sync(0xffffffffu, st[s].l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (s == mine) {
        has_keys = fr[s].end > fr[s].begin;
        own.m = st[s].m;
        own.l = l;
      }
    }
    if (mine >= R) continue;
    const index_t r = rows.row(mine, lane / 4);
    // A row without keys (padding among them) has nothing left to compute on either side.
    index_t lo = tl, hi = tr + 1;
    if (has_keys) {
      lo = cut.lo, hi = cut.hi;
      const index_t i = rows.query(r);
      const float4 info = sk.info[r - row0];
      const index_range kr = p.key_range(b, i);
      detail::far_tile_bound bd;
      bd.abs_scale = ::fabs(static_cast<double>(p.scale));
      bd.slope = info.y;
      bd.log_geo = info.z;
      const detail::far_row row{
          p.q_offset(b) + i - p.k_offset(b), kr.begin, kr.end, p.distance_shift(b, i), info.x, own};
      if (search_lo) {
        // Keys left of x = u BN are at distance t0 - (x - 1) or more.
        const double d = bd.min_distance(own, row.qnorm, kmax_left(tl * BN), row.shift);
        const double x = static_cast<double>(row.t0 + 1) - d;
        if (x >= static_cast<double>(cut.lo * BN)) {
          index_t u = x >= static_cast<double>(tl * BN) ? tl : static_cast<index_t>(x) / BN;
          for (int k = 0; k < 2 && u > cut.lo; ++k, --u)
            if (detail::left_negligible(bd, row, kmax_left(u * BN), u * BN)) {
              lo = u;
              break;
            }
        }
      }
      if (search_hi) {
        // Keys from x = v BN on are at distance x - t0 or more.
        const double d = bd.min_distance(own, row.qnorm, kmax_right((tr + 1) * BN), row.shift);
        const double x = static_cast<double>(row.t0) + d;
        if (x < static_cast<double>(cut.hi * BN)) {
          const index_t first = tr + 1;
          index_t v = x <= static_cast<double>(first * BN)
                          ? first
                          : (static_cast<index_t>(x) + BN - 1) / BN;
          for (int k = 0; k < 2 && v < cut.hi; ++k, ++v)
            if (detail::right_negligible(bd, row, kmax_right(v * BN), v * BN)) {
              hi = v;
              break;
            }
        }
      }
    }
    // The best proof among the warps that hold the row.
    atomicMax(&sk.row_lo[r - row0], static_cast<long long>(lo));
    atomicMin(&sk.row_hi[r - row0], static_cast<long long>(hi));
  }
  __syncthreads();
  // The block's cuts: the one every row allows (each row slot read and reset by one thread).
  long long lo = no_cut_hi, hi = no_cut_lo;
  for (int lr = threadIdx.x; lr < Tr::block_m; lr += Tr::threads) {
    lo = lo < sk.row_lo[lr] ? lo : sk.row_lo[lr];
    hi = hi > sk.row_hi[lr] ? hi : sk.row_hi[lr];
    sk.row_lo[lr] = no_cut_lo;
    sk.row_hi[lr] = no_cut_hi;
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) {
    const long long ol = __shfl_xor_sync(0xffffffffu, lo, off);
    const long long oh = __shfl_xor_sync(0xffffffffu, hi, off);
    lo = lo < ol ? lo : ol;
    hi = hi > oh ? hi : oh;
  }
  long long* const slot = sk.block_cut + 2 * parity;
  if (lane == 0) {
    atomicMin(slot, lo);
    atomicMax(slot + 1, hi);
  }
  __syncthreads();
  tile_cuts out = cut;
  out.lo = slot[0] > cut.lo ? static_cast<std::int32_t>(slot[0]) : cut.lo;
  out.hi = slot[1] < cut.hi ? static_cast<std::int32_t>(slot[1]) : cut.hi;
  // The other pair was last read in the previous search, which every thread has left; the
  // next search reaches it after at least one more barrier.
  if (threadIdx.x == 0) {
    sk.block_cut[2 * (parity ^ 1)] = no_cut_hi;
    sk.block_cut[2 * (parity ^ 1) + 1] = no_cut_lo;
  }
  return out;
}

}  // namespace cuda_detail
}  // namespace alibi
