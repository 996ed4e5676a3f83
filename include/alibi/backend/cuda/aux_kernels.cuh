// SPDX-License-Identifier: MIT
// The small kernels around the forward kernel: key_norm_kernel and norm_scan_kernel, which
// prepare far-tile skipping's per-block key-norm bounds and their prefix / suffix maxima
// before the forward kernel runs, and merge_kernel, which combines the split-KV partial
// results after it.
#pragma once

#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/backend/cuda/traits.cuh"
#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

/// What key_norm_kernel reads and writes: K, and the bounds of the key blocks
/// [t_first, grid) of every (batch, kv head) into out (batch, kv_heads, grid). Each block's
/// bound covers its keys some row of the problem `p` can see and its key mask allows (the
/// others are not read), or, with all_keys, every key below k_len.
template <class T>
struct key_norm_args {
  attention_problem p;  // batch, kv_heads, k_len; the rows' key ranges and the key mask
  tensor_view<const T, 4> k;
  tensor_view<float, 3> out;
  index_t grid = 0, t_first = 0;
  bool aligned = false;  // K's rows start at 16-byte boundaries
  bool all_keys = false;
};

/// Far-tile skipping: the largest key-norm bound of each block of key_norm_block keys (see
/// key_norm_args). One warp per block of keys. When a row is a power-of-two number of
/// 16-byte pieces (every head dim but 96), each lane reads one piece and a warp-wide load
/// covers whole rows, contiguous when the rows are (the sums of a row's pieces are formed
/// by shuffles in a fixed order: the result does not depend on the run); else each lane
/// takes whole rows.
template <class T, int D>
__global__ void __launch_bounds__(128) key_norm_kernel(const key_norm_args<T> a) {
  const attention_problem& p = a.p;
  const index_t blocks = a.grid - a.t_first;
  const index_t w = static_cast<index_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (w >= p.batch * p.kv_heads * blocks) return;  // whole warps
  const int lane = threadIdx.x % 32;
  const index_t t = a.t_first + w % blocks, bh = w / blocks;
  const index_t b = bh / p.kv_heads, hk = bh % p.kv_heads;
  // Only keys some row can reach: the rows' key ranges are monotone in the row.
  index_t lo = 0, hi = p.k_len;
  if (!a.all_keys) {
    const index_t lq = p.len_q(b);
    lo = lq > 0 ? p.key_range(b, 0).begin : 0;
    hi = lq > 0 ? p.key_range(b, lq - 1).end : 0;
  }
  const index_t j_lo = lo > t * key_norm_block ? lo : t * key_norm_block;
  const index_t j_hi = hi < (t + 1) * key_norm_block ? hi : (t + 1) * key_norm_block;
  constexpr int vec = 16 / static_cast<int>(sizeof(T)), pieces = D / vec;
  auto squares = [&](const T* e, int n) {
    float sq = 0.0f;
    for (int c = 0; c < n; ++c) {
      const float x = elem<T>::to_float(e[c]);
      sq = fmaf(x, x, sq);
    }
    return sq;
  };
  float m = 0.0f;
  if constexpr (32 % pieces == 0) {
    constexpr int rows_per_load = 32 / pieces;
    const int piece = lane % pieces;
#pragma unroll 4
    for (index_t j0 = j_lo; j0 < j_hi; j0 += rows_per_load) {
      const index_t j = j0 + lane / pieces;
      const bool used = j < j_hi && !(!a.all_keys && p.key_excluded(b, j));
      float sq = 0.0f;
      if (used) {
        const T* e = a.k.ptr(b, hk, j) + piece * vec;
        if (a.aligned) {
          const int4 raw = *reinterpret_cast<const int4*>(e);
          sq = squares(reinterpret_cast<const T*>(&raw), vec);
        } else {
          sq = squares(e, vec);
        }
      }
#pragma unroll
      for (int off = pieces / 2; off >= 1; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
      if (used) m = detail::max_keep_nan(m, detail::key_norm_bound(sq, D));  // NaN: no skipping
    }
  } else {
    for (index_t j = j_lo + lane; j < j_hi; j += 32)
      if (a.all_keys || !p.key_excluded(b, j))
        m = detail::max_keep_nan(m, detail::key_norm_bound(squares(a.k.ptr(b, hk, j), D), D));
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2)
    m = detail::max_keep_nan(m, __shfl_xor_sync(0xffffffffu, m, off));
  if (lane == 0) a.out(b, hk, t) = m;
}

/// Far-tile skipping: the prefix and suffix maxima (fwd_args::norm_prefix / norm_suffix)
/// of the per-block key-norm bounds, read from `suffix` (key_norm_kernel's output,
/// overwritten in place) or, when `caller`, from params.key_norm_bounds. One warp per
/// (batch, kv head): each lane scans a contiguous segment, the lanes' segment maxima are
/// scanned by shuffles. NaN propagates (max_keep_nan), disabling skipping past it.
template <class T>
__global__ void __launch_bounds__(128)
    norm_scan_kernel(const fwd_args<T> a, float* prefix, float* suffix, bool caller) {
  const attention_problem& p = a.p;
  const index_t bh = static_cast<index_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (bh >= p.batch * p.kv_heads) return;  // whole warps
  const int lane = threadIdx.x % 32;
  const index_t g = a.norm_grid, b = bh / p.kv_heads, hk = bh % p.kv_heads;
  float* pre = prefix + bh * g;
  float* suf = suffix + bh * g;
  auto value = [&](index_t t) { return caller ? p.key_norm_bounds(b, hk, t) : suf[t]; };
  const index_t seg = (g + 31) / 32;
  const index_t s0 = lane * seg < g ? lane * seg : g, s1 = s0 + seg < g ? s0 + seg : g;
  float mx = 0.0f;
  for (index_t t = s0; t < s1; ++t) mx = detail::max_keep_nan(mx, value(t));
  // Inclusive scans of the segment maxima: over lanes <= lane (before) and >= lane (after).
  float before = mx, after = mx;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float u = __shfl_up_sync(0xffffffffu, before, off);
    const float v = __shfl_down_sync(0xffffffffu, after, off);
    if (lane >= off) before = detail::max_keep_nan(before, u);
    if (lane + off < 32) after = detail::max_keep_nan(after, v);
  }
  float run = __shfl_up_sync(0xffffffffu, before, 1);
  if (lane == 0) run = 0.0f;
  for (index_t t = s0; t < s1; ++t) pre[t] = run = detail::max_keep_nan(run, value(t));
  run = __shfl_down_sync(0xffffffffu, after, 1);
  if (lane == 31) run = 0.0f;
  // Each value is read before its own slot is overwritten.
  for (index_t t = s1 - 1; t >= s0; --t) suf[t] = run = detail::max_keep_nan(run, value(t));
}

/// Combines the split-KV partial results of each row: one warp per (batch, head, row), lane
/// holding head dims lane + 32 u. Each split's partial result (normalized output, base-2
/// logsumexp without the shift) is the state softmax_state::from_lse2(lse2) with output o; the
/// splits are merged in order with merge_states. A split with no weight (no keys, or
/// negligible against the others) is skipped: its partial output is 0 (or never formed).
/// A NaN split makes the row NaN; a row without keys in any split gets 0 and -inf.
template <class T, int D>
__global__ void __launch_bounds__(128) merge_kernel(const fwd_args<T> a) {
  const attention_problem& p = a.p;
  const index_t rows = p.batch * p.q_heads * p.q_len;
  const index_t row = static_cast<index_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const index_t i = row % p.q_len, h = (row / p.q_len) % p.q_heads, b = row / (p.q_len * p.q_heads);
  const index_t stride = rows;  // between splits, in rows
  softmax_state st;
  float acc[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) acc[u] = 0.0f;
  for (index_t s = 0; s < a.splits; ++s) {
    const softmax_state part = detail::softmax_state::from_lse2(a.part_lse[s * stride + row]);
    const detail::softmax_merge mg = detail::merge_states(st, part);
    const float* o = a.part_o + (s * stride + row) * D;
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
      acc[u] = (mg.wa != 0.0f ? acc[u] * mg.wa : 0.0f) +
               (mg.wb != 0.0f ? mg.wb * o[lane + 32 * u] : 0.0f);
    st = mg.state;
  }
  const float inv = st.inverse_sum();
#pragma unroll
  for (int u = 0; u < D / 32; ++u)
    a.out(b, h, i, lane + 32 * u) = elem<T>::from_float(acc[u] * inv);
  if (lane == 0 && p.lse.data) {
    const row_frame f = detail::make_row_frame(p, b, h, i);
    p.lse(b, h, i) = st.lse(-f.slope * static_cast<float>(f.shift));
  }
}

}  // namespace cuda_detail
}  // namespace alibi
