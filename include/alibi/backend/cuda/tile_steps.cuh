// SPDX-License-Identifier: MIT
// The forward kernel's per-tile steps, each a device function of one warp (or of the whole
// block, for staging): stage rows into shared memory, S = Q K^T (compute_scores), the ALiBi
// bias and the masks (bias_and_masks, built on apply_bias_and_masks), the online softmax of
// the tile (softmax_tile, one detail::softmax_state per row), and O += P V (accumulate_pv).
// Every step is __forceinline__: the kernel is one function after inlining, with its
// accumulators in registers.
#pragma once

#include <cstdint>

#include "alibi/backend/cuda/mma_layout.hpp"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/backend/cuda/traits.cuh"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

template <class T>
__device__ __forceinline__ T zero_element() {
  return elem<T>::from_float(0.0f);
}

/// Stages `rows` rows of `src` (row r at row_ptr(r), or zeros where it returns null) into
/// shared memory with row stride Tr::ld. Invalid rows are zero-filled, never read.
template <class Tr, class RowPtr>
__device__ __forceinline__ void stage_rows(typename Tr::element* dst, int rows, bool aligned,
                                           RowPtr row_ptr) {
  using T = typename Tr::element;
  constexpr int D = Tr::head_dim, vec = Tr::vec, chunks = D / vec;
  if (aligned) {
    for (int idx = threadIdx.x; idx < rows * chunks; idx += Tr::threads) {
      const int r = idx / chunks, c = idx % chunks;
      T* d = dst + r * Tr::ld + c * vec;
      const T* s = row_ptr(r);
      if (s)
        cp_async_16(d, s + c * vec);
      else
        *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * D; idx += Tr::threads) {
      const int r = idx / D, c = idx % D;
      const T* s = row_ptr(r);
      dst[r * Tr::ld + c] = s ? s[c] : zero_element<T>();
    }
  }
}

/// Loads this warp's Q fragments from shared memory into registers (Tr::q_in_regs).
template <class Tr>
__device__ __forceinline__ void load_q_fragments(q_fragments<Tr>& q_frag,
                                                 const typename Tr::element* s_qw, int lane) {
  constexpr int LD = Tr::ld;
  const detail::lane_offset qo = detail::ldsm_a(lane);
#pragma unroll
  for (int mi = 0; mi < Tr::m_tiles; ++mi)
#pragma unroll
    for (int ks = 0; ks < Tr::head_dim / 16; ++ks)
      ldmatrix_x4(q_frag[mi][ks], s_qw + (16 * mi + qo.row) * LD + ks * 16 + qo.col);
}

/// S += Q K^T on tensor cores for the warp's rows (Q at s_qw) and its keys koff.. of the
/// tile at s_k.
template <class Tr>
__device__ __forceinline__ void qk_tensor_cores(score_acc<Tr>& acc_s,
                                                const typename Tr::element* s_qw,
                                                const typename Tr::element* s_k,
                                                const q_fragments<Tr>& q_frag, int koff, int lane) {
  using T = typename Tr::element;
  constexpr int D = Tr::head_dim, LD = Tr::ld, MI = Tr::m_tiles, NT = Tr::n_tiles;
  const detail::lane_offset qo = detail::ldsm_a(lane);
  const detail::lane_offset ko = detail::ldsm_b_nmajor(lane);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    std::uint32_t qa[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      if constexpr (Tr::q_in_regs) {
#pragma unroll
        for (int r = 0; r < 4; ++r) qa[mi][r] = q_frag[mi][ks][r];
      } else {
        ldmatrix_x4(qa[mi], s_qw + (16 * mi + qo.row) * LD + ks * 16 + qo.col);
      }
    }
#pragma unroll
    for (int np = 0; np < NT / 2; ++np)
      mma_b_x4<T, false>(acc_s, np, qa, s_k + (koff + np * 16 + ko.row) * LD + ks * 16 + ko.col);
  }
}

/// S += Q K^T with fp32 FMA (float; one m tile, one key warp), in the accumulator layout
/// of the tensor-core path.
template <class Tr>
__device__ __forceinline__ void qk_fma(score_acc<Tr>& acc_s, const float* s_qw, const float* s_k,
                                       int lane) {
  constexpr int D = Tr::head_dim, LD = Tr::ld, NT = Tr::n_tiles;
  const int tq = lane % 4;
  const float* q0 = s_qw + (lane / 4) * LD;
  const float* q1 = q0 + 8 * LD;
#pragma unroll 4
  for (int d = 0; d < D; d += 4) {
    const float4 x0 = *reinterpret_cast<const float4*>(q0 + d);
    const float4 x1 = *reinterpret_cast<const float4*>(q1 + d);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float4 y = *reinterpret_cast<const float4*>(s_k + (n * 8 + 2 * tq + c) * LD + d);
        acc_s[0][n][c] += x0.x * y.x + x0.y * y.y + x0.z * y.z + x0.w * y.w;
        acc_s[0][n][2 + c] += x1.x * y.x + x1.y * y.y + x1.z * y.z + x1.w * y.w;
      }
  }
}

/// S = Q K^T for this warp's rows and keys of the tile.
template <class Tr>
__device__ __forceinline__ void compute_scores(score_acc<Tr>& acc_s,
                                               const typename Tr::element* s_qw,
                                               const typename Tr::element* s_k,
                                               const q_fragments<Tr>& q_frag, int koff, int lane) {
#pragma unroll
  for (int mi = 0; mi < Tr::m_tiles; ++mi)
#pragma unroll
    for (int n = 0; n < Tr::n_tiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[mi][n][e] = 0.0f;
  if constexpr (Tr::tensor_cores)
    qk_tensor_cores<Tr>(acc_s, s_qw, s_k, q_frag, koff, lane);
  else
    qk_fma<Tr>(acc_s, s_qw, s_k, lane);
}

/// Which form of the distance a whole warp's tile can use: `both` the general max(a - c,
/// c - b); `left` a - c (every key of the tile left of every row's query, a + b = 2 t when
/// not clamped); `right` c - b. The one-sided forms are the same float operations as
/// tile_distance on its chosen side, so results do not depend on the form.
enum class key_side : int { both = 0, left = 1, right = 2 };

/// How a warp treats one key tile: whether any mask applies to it, and its key_side.
struct tile_class {
  bool masked = true;
  key_side side = key_side::both;
};

/// Classifies the tile starting at key j0 for the warp's rows. Warp-collective (every lane
/// calls it; the result is warp-uniform).
template <class Tr>
__device__ __forceinline__ tile_class classify_tile(const row_frames<Tr>& fr, std::int32_t j0,
                                                    bool has_key_mask) {
  constexpr int BN = Tr::block_n;
  bool inside = true, left = true, right = true;
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    inside = inside && fr[s].begin <= j0 && fr[s].end >= j0 + BN;
    const detail::tile_frame tf = detail::make_tile_frame(fr[s], j0, BN);
    left = left && tf.a + tf.b >= 2.0f * (BN - 1);
    right = right && tf.a + tf.b <= 0.0f;
  }
  tile_class tc;
  tc.masked = has_key_mask || !__all_sync(0xffffffffu, inside);
  tc.side = __all_sync(0xffffffffu, left)    ? key_side::left
            : __all_sync(0xffffffffu, right) ? key_side::right
                                             : key_side::both;
  return tc;
}

/// The per-tile bias and mask step: turns the warp's S = Q K^T accumulators of the tile
/// that starts at key j0 into base-2 scores, (scale q.k - slope (|q_pos - k_pos| - shift))
/// * log2(e), with -inf where a key is outside the row's allowed range or excluded by the
/// key mask. This is the building block a backward kernel reuses to recompute the forward
/// scores (and so P) from the same accumulators, with bit-identical results.
///  - fr: the thread's row frames; col0: the thread's first column within the tile (its
///    key warp's offset + 2 (lane % 4)), so that each element's column is a compile-time
///    constant relative to it;
///  - neg_slope_l2: -slope * log2(e) per row; scale_l2: scale * log2(e);
///  - masked: apply the range masks (tile_class::masked); s_flags: the tile's key-mask
///    flags (0 or -inf per key) when has_key_mask.
/// Side: the distance form (classify_tile); it must be valid for every row of the warp.
template <class Tr, key_side Side>
__device__ __forceinline__ void apply_bias_and_masks(score_acc<Tr>& acc_s, const row_frames<Tr>& fr,
                                                     std::int32_t j0, int col0, float scale_l2,
                                                     const row_values<Tr>& neg_slope_l2,
                                                     bool masked, bool has_key_mask,
                                                     const float* s_flags) {
  constexpr int BN = Tr::block_n, NT = Tr::n_tiles;
  const float neg_inf = detail::neg_inf_f();
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    const int mi = s / 2, k = s % 2;
    const detail::tile_frame tf = detail::make_tile_frame(fr[s], j0 + col0, BN);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = n * 8 + c;
        const float fc = static_cast<float>(col);
        const float dist = Side == key_side::left    ? tf.a - fc
                           : Side == key_side::right ? fc - tf.b
                                                     : detail::tile_distance(tf, fc);
        float x = detail::score_l2(acc_s[mi][n][2 * k + c], scale_l2, neg_slope_l2[s], dist);
        if (masked) {
          if (col < tf.begin || col >= tf.end) x = neg_inf;
          if (has_key_mask) x += s_flags[col0 + col];
        }
        acc_s[mi][n][2 * k + c] = x;
      }
  }
}

/// Bias and masks for the tile at j0: classifies the tile for the warp, then runs the
/// apply_bias_and_masks instance of its key_side (one instance per side; the side is
/// warp-uniform). Warp-collective.
template <class Tr>
__device__ __forceinline__ void bias_and_masks(score_acc<Tr>& acc_s, const row_frames<Tr>& fr,
                                               std::int32_t j0, int col0, float scale_l2,
                                               const row_values<Tr>& neg_slope_l2,
                                               bool has_key_mask, const float* s_flags) {
  const tile_class tc = classify_tile<Tr>(fr, j0, has_key_mask);
  if (tc.side == key_side::left)
    apply_bias_and_masks<Tr, key_side::left>(acc_s, fr, j0, col0, scale_l2, neg_slope_l2, tc.masked,
                                             has_key_mask, s_flags);
  else if (tc.side == key_side::right)
    apply_bias_and_masks<Tr, key_side::right>(acc_s, fr, j0, col0, scale_l2, neg_slope_l2,
                                              tc.masked, has_key_mask, s_flags);
  else
    apply_bias_and_masks<Tr, key_side::both>(acc_s, fr, j0, col0, scale_l2, neg_slope_l2, tc.masked,
                                             has_key_mask, s_flags);
}

/// The online softmax of one tile: per row, the tile maximum over the quad (fmaxf, which
/// ignores NaN scores: they reach the row through 2^(NaN - ref) in the sum instead), the
/// state's step, P = 2^(S - ref) in place of the scores, the row sum (this thread's columns
/// only: summed over the quad in the epilogue), and the rescale of the output accumulators.
template <class Tr>
__device__ __forceinline__ void softmax_tile(score_acc<Tr>& acc_s, out_acc<Tr>& acc_o,
                                             row_states<Tr>& st) {
  constexpr int NT = Tr::n_tiles, DT = Tr::d_tiles;
#pragma unroll
  for (int s = 0; s < Tr::rows_per_thread; ++s) {
    const int mi = s / 2, k = s % 2;
    float mx = detail::neg_inf_f();
#pragma unroll
    for (int n = 0; n < NT; ++n)
      mx = fmaxf(mx, fmaxf(acc_s[mi][n][2 * k], acc_s[mi][n][2 * k + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const detail::softmax_step step = st[s].rescale(mx);
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float pv = detail::exp2_flush(acc_s[mi][n][2 * k + c] - step.ref);
        acc_s[mi][n][2 * k + c] = pv;
        sum += pv;
      }
    st[s].add(step, sum);
    // Nearest tiles come first, so the maximum rarely grows after the first tile: skip
    // the rescale when no row of the warp needs it.
    if (!__all_sync(0xffffffffu, step.factor == 1.0f)) {
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        acc_o[mi][n][2 * k] *= step.factor;
        acc_o[mi][n][2 * k + 1] *= step.factor;
      }
    }
  }
}

/// O += P V on tensor cores: the accumulators of two adjacent S tiles are exactly an A
/// fragment (rows x 16 keys); V is read k-major through ldmatrix.trans.
template <class Tr>
__device__ __forceinline__ void pv_tensor_cores(out_acc<Tr>& acc_o, const score_acc<Tr>& acc_s,
                                                const typename Tr::element* s_v, int koff,
                                                int lane) {
  using T = typename Tr::element;
  constexpr int LD = Tr::ld, MI = Tr::m_tiles, NT = Tr::n_tiles, DT = Tr::d_tiles;
  const detail::lane_offset vo = detail::ldsm_b_kmajor(lane);
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    std::uint32_t pa[MI][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
      pa[mi][0] = elem<T>::pack(acc_s[mi][2 * kk][0], acc_s[mi][2 * kk][1]);
      pa[mi][1] = elem<T>::pack(acc_s[mi][2 * kk][2], acc_s[mi][2 * kk][3]);
      pa[mi][2] = elem<T>::pack(acc_s[mi][2 * kk + 1][0], acc_s[mi][2 * kk + 1][1]);
      pa[mi][3] = elem<T>::pack(acc_s[mi][2 * kk + 1][2], acc_s[mi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp)
      mma_b_x4<T, true>(acc_o, dp, pa, s_v + (koff + kk * 16 + vo.row) * LD + dp * 16 + vo.col);
  }
}

/// O += P V with fp32 FMA: P goes through the warp's rows of the shared fp32 tile (s_pw).
template <class Tr>
__device__ __forceinline__ void pv_fma(out_acc<Tr>& acc_o, const score_acc<Tr>& acc_s,
                                       const float* s_v, float* s_pw, int lane) {
  constexpr int LD = Tr::ld, BN = Tr::block_n, NT = Tr::n_tiles, DT = Tr::d_tiles;
  const int tq = lane % 4;
  float* p0 = s_pw + (lane / 4) * Tr::p_ld;
  float* p1 = p0 + 8 * Tr::p_ld;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      p0[n * 8 + 2 * tq + c] = acc_s[0][n][c];
      p1[n * 8 + 2 * tq + c] = acc_s[0][n][2 + c];
    }
  __syncwarp();
#pragma unroll 4
  for (int j = 0; j < BN; ++j) {
    const float w0 = p0[j], w1 = p1[j];
#pragma unroll
    for (int n = 0; n < DT; ++n) {
      const float2 y = *reinterpret_cast<const float2*>(s_v + j * LD + n * 8 + 2 * tq);
      acc_o[0][n][0] += w0 * y.x;
      acc_o[0][n][1] += w0 * y.y;
      acc_o[0][n][2] += w1 * y.x;
      acc_o[0][n][3] += w1 * y.y;
    }
  }
  __syncwarp();
}

/// O += P V for this warp's rows and keys of the tile.
template <class Tr>
__device__ __forceinline__ void accumulate_pv(out_acc<Tr>& acc_o, const score_acc<Tr>& acc_s,
                                              const typename Tr::element* s_v, float* s_pw,
                                              int koff, int lane) {
  if constexpr (Tr::tensor_cores)
    pv_tensor_cores<Tr>(acc_o, acc_s, s_v, koff, lane);
  else
    pv_fma<Tr>(acc_o, acc_s, s_v, s_pw, lane);
}

}  // namespace cuda_detail
}  // namespace alibi
