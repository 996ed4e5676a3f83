// SPDX-License-Identifier: MIT
// The forward kernel's epilogue: the quad sums of each row's softmax state, the decoding
// instance's merge of its key warps, normalization, the writes of the output and the
// logsumexp (or of a split's partial result), and the careful path for the rows whose
// tiled result is not finite.
#pragma once

#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/backend/cuda/traits.cuh"
#include "alibi/core/problem.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

/// The careful path for one row, run by a whole warp: recomputes the row key by key in
/// fp32, adding a key's contribution only where its probability is non-zero. Used when the
/// tiled result is not finite: P V with tensor cores multiplies masked probabilities (exact
/// zeros) by every V row of the tile, so a NaN/Inf in a V row that only other rows attend
/// to would otherwise reach this row as 0 * NaN. Writes the row's (normalized) output and
/// its softmax state (base 2; a NaN score makes the state NaN).
template <class T, int D>
__device__ void careful_row(const fwd_args<T>& a, index_t b, index_t h, index_t i,
                            const row_frame& f, index_t j_lo, index_t j_hi, float (&o)[D / 32],
                            softmax_state& st) {
  const attention_problem& p = a.p;
  const int lane = threadIdx.x % 32;
  const index_t hk = p.kv_head(h);
  const index_t j_begin = f.begin > j_lo ? f.begin : j_lo, j_end = f.end < j_hi ? f.end : j_hi;
  float qv[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) {
    // A row without keys (a padded row) is never read.
    qv[u] = j_begin < j_end ? elem<T>::to_float(a.q(b, h, i, lane + 32 * u)) : 0.0f;
    o[u] = 0.0f;
  }
  const float scale_l2 = p.scale * detail::log2e_f, neg_slope_l2 = -f.slope * detail::log2e_f;
  st = softmax_state{};
  for (index_t j = j_begin; j < j_end; ++j) {
    if (p.key_excluded(b, j)) continue;
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < D / 32; ++u) dot += qv[u] * elem<T>::to_float(a.k(b, hk, j, lane + 32 * u));
#pragma unroll
    for (int s = 16; s >= 1; s /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    const index_t dist = (f.t0 >= j ? f.t0 - j : j - f.t0) - f.shift;
    const float x = detail::score_l2(dot, scale_l2, neg_slope_l2, static_cast<float>(dist));
    // The state keeps a NaN score (max_keep_nan), so a NaN row stays NaN.
    const detail::softmax_step step = st.rescale(x);
    const float pj = detail::exp2_flush(x - step.ref);
    st.add(step, pj);
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
      o[u] = o[u] * step.factor +
             (pj != 0.0f ? pj * elem<T>::to_float(a.v(b, hk, j, lane + 32 * u)) : 0.0f);
  }
  // Divided (not multiplied by inverse_sum()): this path favours exactness over speed. A
  // row with no keys gives 0, a NaN row NaN.
#pragma unroll
  for (int u = 0; u < D / 32; ++u) o[u] = st.l > 0.0f ? o[u] / st.l : (st.l != st.l ? st.l : 0.0f);
}

/// Writes one row's result: the final output and logsumexp, or the split's partial result
/// (normalized output, base-2 logsumexp without the distance shift: see softmax_state::from_lse2).
template <class T>
struct row_writer {
  const fwd_args<T>& a;
  index_t split, b;

  __device__ __forceinline__ void value(index_t h, index_t i, int d, float x) const {
    if (a.part_o)
      a.part_o[(((split * a.p.batch + b) * a.p.q_heads + h) * a.p.q_len + i) * a.p.head_dim + d] =
          x;
    else
      a.out(b, h, i, d) = elem<T>::from_float(x);
  }
  __device__ __forceinline__ void stats(index_t h, index_t i, const softmax_state& st,
                                        const row_frame& f) const {
    if (a.part_lse) {
      a.part_lse[((split * a.p.batch + b) * a.p.q_heads + h) * a.p.q_len + i] = st.lse2();
    } else if (a.p.lse.data) {
      // The scores were computed with the distance shift removed (+slope * shift).
      a.p.lse(b, h, i) = st.lse(-f.slope * static_cast<float>(f.shift));
    }
  }
};

/// Sums each row's l over its quad (the four threads that hold the row's columns; their m
/// are already equal). Afterwards all four hold the same state.
template <class Tr>
__device__ __forceinline__ void sum_over_quads(row_states<Tr>& st) {
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    st[s].l += __shfl_xor_sync(0xffffffffu, st[s].l, 1);
    st[s].l += __shfl_xor_sync(0xffffffffu, st[s].l, 2);
  }
}

/// The decoding instance: merges the key warps' partial states and outputs of the same
/// rows into key warp 0 (merge_states, in key-warp order), through shared memory at `red`
/// (the K buffers, free once every warp passed the main loop's last barrier). Block-wide
/// (every thread calls it). Returns whether this warp holds the merged rows.
template <class Tr>
__device__ __forceinline__ bool merge_key_warps(row_states<Tr>& st, out_acc<Tr>& acc_o, float* red,
                                                bool no_tiles) {
  constexpr int KW = Tr::key_warps, D = Tr::head_dim, DT = Tr::d_tiles;
  static_assert(Tr::m_tiles == 1, "key warps share one m tile");
  const int lane = threadIdx.x % 32, tq = lane % 4, w = (threadIdx.x / 32) % KW;
  // Layout of `red`: m and l (KW, 16), then O (KW, 16, D), fp32.
  if (no_tiles) __syncthreads();
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int row = lane / 4 + 8 * s;
    if (tq == 0) {
      red[w * 16 + row] = st[s].m;
      red[KW * 16 + w * 16 + row] = st[s].l;
    }
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        red[2 * KW * 16 + (w * 16 + row) * D + n * 8 + 2 * tq + c] = acc_o[0][n][2 * s + c];
  }
  __syncthreads();
  if (w != 0) return false;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const int row = lane / 4 + 8 * s;
    // Warp 0's own state and output are still in registers; the others come from `red`.
    for (int v = 1; v < KW; ++v) {
      softmax_state other;
      other.m = red[v * 16 + row];
      other.l = red[KW * 16 + v * 16 + row];
      const detail::softmax_merge mg = detail::merge_states(st[s], other);
#pragma unroll
      for (int n = 0; n < DT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          acc_o[0][n][2 * s + c] =
              acc_o[0][n][2 * s + c] * mg.wa +
              red[2 * KW * 16 + (v * 16 + row) * D + n * 8 + 2 * tq + c] * mg.wb;
      st[s] = mg.state;
    }
  }
  return true;
}

/// Normalizes each row's output by its sum and finds the rows whose result is not finite:
/// bad_mask[s] is the warp's ballot of (valid row, some element of this thread not finite).
template <class Tr>
__device__ __forceinline__ void normalize_rows(const row_states<Tr>& st, out_acc<Tr>& acc_o,
                                               const warp_row_map& rows,
                                               unsigned (&bad_mask)[Tr::rows_per_thread]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    const int mi = s / 2, k = s % 2;
    const float inv = st[s].inverse_sum();
    bool finite = st[s].l == st[s].l;
#pragma unroll
    for (int n = 0; n < Tr::d_tiles; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = acc_o[mi][n][2 * k + c] * inv;
        acc_o[mi][n][2 * k + c] = x;
        finite = finite && isfinite(x);
      }
    bad_mask[s] = __ballot_sync(0xffffffffu, rows.row(s, lane / 4) < rows.packed_rows && !finite);
  }
}

/// The epilogue of the fused kernel: sums l over the quads, merges the key warps' states
/// (decoding), normalizes, writes the finite rows with their logsumexp, and sends rows
/// whose result is not finite (any element of the row, in any thread of its quad) through
/// careful_row. Block-wide for the decoding instance (merge_key_warps), warp-wide else.
template <class Tr>
__device__ __forceinline__ void finish_rows(const fwd_args<typename Tr::element>& a,
                                            const row_writer<typename Tr::element>& writer,
                                            row_states<Tr>& st, out_acc<Tr>& acc_o,
                                            const warp_row_map& rows, float* red, bool no_tiles) {
  using T = typename Tr::element;
  constexpr int D = Tr::head_dim, R = Tr::rows_per_thread;
  const attention_problem& p = a.p;
  const int lane = threadIdx.x % 32, tq = lane % 4;
  const index_t b = writer.b, split = writer.split;
  sum_over_quads<Tr>(st);
  if constexpr (Tr::key_warps > 1) {
    if (!merge_key_warps<Tr>(st, acc_o, red, no_tiles)) return;
  }
  unsigned bad_mask[R];
  normalize_rows<Tr>(st, acc_o, rows, bad_mask);
  unsigned any_bad = 0;
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const int mi = s / 2, k = s % 2;
    any_bad |= bad_mask[s];
    const unsigned quad_bad = (bad_mask[s] >> (lane & ~3)) & 0xFu;
    const index_t r = rows.row(s, lane / 4), i = rows.query(r), h = rows.head(r);
    if (r >= rows.packed_rows || quad_bad) continue;
#pragma unroll
    for (int n = 0; n < Tr::d_tiles; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) writer.value(h, i, n * 8 + 2 * tq + c, acc_o[mi][n][2 * k + c]);
    if (tq == 0) writer.stats(h, i, st[s], detail::make_row_frame(p, b, h, i));
  }
  if (any_bad) {
    for (int s = 0; s < R; ++s)
      for (int g = 0; g < 8; ++g) {
        if (((bad_mask[s] >> (4 * g)) & 0xFu) == 0) continue;
        const index_t r = rows.row(s, g), i = rows.query(r), h = rows.head(r);
        const row_frame f = detail::make_row_frame(p, b, h, i);
        float o[D / 32];
        softmax_state cst;
        careful_row<T, D>(a, b, h, i, f, split * a.chunk, split * a.chunk + a.chunk, o, cst);
#pragma unroll
        for (int u = 0; u < D / 32; ++u) writer.value(h, i, lane + 32 * u, o[u]);
        if (lane == 0) writer.stats(h, i, cst, f);
      }
  }
}

}  // namespace cuda_detail
}  // namespace alibi
