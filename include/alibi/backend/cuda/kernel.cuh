// SPDX-License-Identifier: MIT
// The fused forward kernel of the CUDA backend (flash-attention style) and the split-KV
// merge kernel. One block handles block_m query rows of one (batch, kv head): the rows of
// every query head of that kv head's group, interleaved (packed row r = query i * group +
// head g), so that each K/V tile staged in shared memory serves the whole GQA group. Key
// tiles are visited from the last (nearest to the queries) to the first.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/detail/mma_layout.hpp"
#include "alibi/detail/tile_rows.hpp"

namespace alibi {
namespace cuda_detail {

using detail::attention_problem;
using detail::row_frame;

/// The compile-time configuration of one kernel instance. half/bfloat16 use tensor cores
/// (mma.sync m16n8k16, fp32 accumulation); float uses FMA with the same per-thread
/// ownership of score and output elements, so the softmax code is shared.
template <class T, int D>
struct kernel_traits {
  static_assert(D % 32 == 0 && D >= 32 && D <= 128, "head dims 32, 64, 96, 128");
  using element = T;
  static constexpr bool tensor_cores = !std::is_same<T, float>::value;
  static constexpr int head_dim = D;
  static constexpr int warps = 4;
  static constexpr int threads = 32 * warps;
  static constexpr int block_m = 16 * warps;  // packed query rows per block, 16 per warp
  // Keys per tile: as many as the registers allow (the S tile is block_n / 8 accumulator
  // tiles per warp), fewer for fp32 whose products come from shared memory.
  static constexpr int block_n = tensor_cores ? (D <= 64 ? 128 : 64) : 32;
  static constexpr int n_tiles = block_n / 8;  // 16x8 accumulator tiles of S per warp
  static constexpr int d_tiles = D / 8;        // 16x8 accumulator tiles of O per warp
  static constexpr int vec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  // Shared-memory rows are padded by 16 bytes: the 8 rows an ldmatrix (or a 16-byte
  // load pass) touches then start in 8 different bank groups, without conflicts.
  static constexpr int ld = D + vec;
  static constexpr int p_ld = block_n + 4;  // fp32 P rows (FMA path only), padded likewise
  static constexpr std::size_t smem_bytes =
      sizeof(T) * static_cast<std::size_t>((block_m + 2 * block_n) * ld) + sizeof(float) * block_n +
      (tensor_cores ? 0 : sizeof(float) * block_m * p_ld);
};

/// The kernel's arguments (trivially copyable).
template <class T>
struct fwd_args {
  attention_problem p;
  tensor_view<const T, 4> q, k, v;
  tensor_view<T, 4> out;
  float* part_o = nullptr;    // split-KV: (splits, batch, q_heads, q_len, head_dim), normalized
  float* part_lse = nullptr;  // split-KV: (splits, batch, q_heads, q_len), base 2, no shift
  index_t splits = 1;         // key chunks per row
  index_t chunk = 0;          // keys per chunk (a multiple of block_n)
  index_t row_tiles = 0;      // ceil(group * q_len / block_m)
  bool aligned = false;       // q, k, v rows start at 16-byte boundaries: cp.async
};

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

/// The careful path for one row, run by a whole warp: recomputes the row key by key in
/// fp32, adding a key's contribution only where its probability is non-zero. Used when the
/// tiled result is not finite: P V with tensor cores multiplies masked probabilities (exact
/// zeros) by every V row of the tile, so a NaN/Inf in a V row that only other rows attend
/// to would otherwise reach this row as 0 * NaN. Writes the row's (normalized) output and
/// its base-2 maximum and sum.
template <class T, int D>
__device__ void careful_row(const fwd_args<T>& a, index_t b, index_t h, index_t i,
                            const row_frame& f, index_t j_lo, index_t j_hi, float (&o)[D / 32],
                            float& m_out, float& l_out) {
  const attention_problem& p = a.p;
  const int lane = threadIdx.x % 32;
  const index_t hk = p.kv_head(h);
  const float neg_inf = detail::neg_inf_f();
  const index_t j_begin = f.begin > j_lo ? f.begin : j_lo, j_end = f.end < j_hi ? f.end : j_hi;
  float qv[D / 32];
#pragma unroll
  for (int u = 0; u < D / 32; ++u) {
    // A row without keys (a padded row) is never read.
    qv[u] = j_begin < j_end ? elem<T>::to_float(a.q(b, h, i, lane + 32 * u)) : 0.0f;
    o[u] = 0.0f;
  }
  const float scale_l2 = p.scale * detail::log2e_f, neg_slope_l2 = -f.slope * detail::log2e_f;
  float m = neg_inf, l = 0.0f;
  for (index_t j = j_begin; j < j_end; ++j) {
    if (p.key_excluded(b, j)) continue;
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < D / 32; ++u) dot += qv[u] * elem<T>::to_float(a.k(b, hk, j, lane + 32 * u));
#pragma unroll
    for (int s = 16; s >= 1; s /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    const index_t dist = (f.t0 >= j ? f.t0 - j : j - f.t0) - f.shift;
    const float x = detail::score_l2(dot, scale_l2, neg_slope_l2, static_cast<float>(dist));
    const float m_new = (x > m || x != x) ? x : m;  // NaN stays
    const float ref = m_new == neg_inf ? 0.0f : m_new;
    const float factor = detail::fast_exp2(m - ref), pj = detail::fast_exp2(x - ref);
    l = l * factor + pj;
#pragma unroll
    for (int u = 0; u < D / 32; ++u)
      o[u] = o[u] * factor +
             (pj != 0.0f ? pj * elem<T>::to_float(a.v(b, hk, j, lane + 32 * u)) : 0.0f);
    m = m_new;
  }
#pragma unroll
  for (int u = 0; u < D / 32; ++u) o[u] = l > 0.0f ? o[u] / l : (l != l ? l : 0.0f);
  m_out = m;
  l_out = l;
}

/// Writes one row's result: the final output and logsumexp, or the split's partial result.
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
  __device__ __forceinline__ void stats(index_t h, index_t i, float m, float l,
                                        const row_frame& f) const {
    if (a.part_lse) {
      a.part_lse[((split * a.p.batch + b) * a.p.q_heads + h) * a.p.q_len + i] =
          l != l     ? l
          : l > 0.0f ? m + log2f(l)
                     : detail::neg_inf_f();
    } else if (a.p.lse.data) {
      a.p.lse(b, h, i) = detail::finish_lse_l2(m, l, f);
    }
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::threads)
    attention_kernel(const fwd_args<typename Tr::element> a) {
  using T = typename Tr::element;
  constexpr int D = Tr::head_dim, BM = Tr::block_m, BN = Tr::block_n, LD = Tr::ld;
  constexpr int NT = Tr::n_tiles, DT = Tr::d_tiles;
  const float neg_inf = detail::neg_inf_f();
  extern __shared__ __align__(16) unsigned char smem[];
  T* s_q = reinterpret_cast<T*>(smem);                          // (BM, LD) query rows
  T* s_k = s_q + BM * LD;                                       // (BN, LD) key tile
  T* s_v = s_k + BN * LD;                                       // (BN, LD) value tile
  float* s_key_bias = reinterpret_cast<float*>(s_v + BN * LD);  // (BN) 0 or -inf (key mask)
  float* s_p = s_key_bias + BN;                                 // (BM, p_ld) fp32 P (FMA path)

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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  const bool has_key_mask = p.key_mask.data != nullptr;
  const row_writer<T> writer{a, split, b};

  // This thread's two rows: rows lane/4 and lane/4 + 8 of its warp's 16.
  row_frame fr[2];
  index_t row_h[2], row_i[2];
  bool row_in[2];
  float m[2], l[2], neg_slope_l2[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const index_t r = row0 + warp * 16 + lane / 4 + 8 * k;
    row_in[k] = r < packed_rows;
    row_i[k] = r / group;
    row_h[k] = kvh * group + r % group;
    fr[k] = row_in[k] ? detail::make_row_frame(p, b, row_h[k], row_i[k]) : row_frame{};
    m[k] = neg_inf;
    l[k] = 0.0f;
    neg_slope_l2[k] = -fr[k].slope * detail::log2e_f;
  }
  const float scale_l2 = p.scale * detail::log2e_f;

  // Keys any row of the block may see, within this split's chunk: the positional ranges
  // are monotone in the query position, so the first and last valid rows bound them.
  index_t key_lo = split * a.chunk, key_hi = key_lo + a.chunk;
  {
    const index_t i_first = row0 / group;
    const index_t last_row = (row0 + BM < packed_rows ? row0 + BM : packed_rows) - 1;
    const index_t i_last = (last_row / group < lq ? last_row / group : lq - 1);
    if (i_first > i_last) {
      key_hi = key_lo;
    } else {
      const index_range r0 = p.key_range(b, i_first), r1 = p.key_range(b, i_last);
      key_lo = key_lo > r0.begin ? key_lo : r0.begin;
      key_hi = key_hi < r1.end ? key_hi : r1.end;
      key_hi = key_hi < lk ? key_hi : lk;
    }
  }
  const index_t tile_first = key_lo / BN;
  const index_t tile_end = key_hi > key_lo ? (key_hi + BN - 1) / BN : tile_first;

  float acc_o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[n][e] = 0.0f;

  auto q_row = [&](int r) -> const T* {
    const index_t pr = row0 + r, i = pr / group;
    return pr < packed_rows && i < lq ? a.q.ptr(b, kvh * group + pr % group, i) : nullptr;
  };
  auto stage_keys = [&](T* dst, const tensor_view<const T, 4>& src, index_t j0, bool flags) {
    stage_rows<Tr>(dst, BN, a.aligned, [&](int r) -> const T* {
      const index_t j = j0 + r;
      return j < lk && !p.key_excluded(b, j) ? src.ptr(b, kvh, j) : nullptr;
    });
    if (flags && has_key_mask)
      for (int r = threadIdx.x; r < BN; r += Tr::threads)
        s_key_bias[r] = j0 + r < lk && p.key_excluded(b, j0 + r) ? neg_inf : 0.0f;
  };

  std::uint32_t q_frag[Tr::tensor_cores ? D / 16 : 1][4];
  if (tile_end > tile_first) {
    stage_rows<Tr>(s_q, BM, a.aligned, q_row);
    stage_keys(s_k, a.k, (tile_end - 1) * BN, true);
    cp_async_commit();
  }
  for (index_t t = tile_end - 1; t >= tile_first; --t) {
    const index_t j0 = t * BN;
    cp_async_wait_all();
    __syncthreads();  // K(t) (and Q) have landed; every warp is done with the V buffer
    if constexpr (Tr::tensor_cores) {
      if (t == tile_end - 1) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          const detail::lane_offset o = detail::ldsm_a(lane);
          ldmatrix_x4(q_frag[ks], s_q + (warp * 16 + o.row) * LD + ks * 16 + o.col);
        }
      }
    }
    stage_keys(s_v, a.v, j0, false);
    cp_async_commit();

    // S = Q K^T for this warp's 16 rows: acc_s[n][e] is row acc_element(lane, e).row,
    // key column 8 n + acc_element(lane, e).col.
    float acc_s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_s[n][e] = 0.0f;
    if constexpr (Tr::tensor_cores) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          std::uint32_t kb[4];
          const detail::lane_offset o = detail::ldsm_b_nmajor(lane);
          ldmatrix_x4(kb, s_k + (np * 16 + o.row) * LD + ks * 16 + o.col);
          mma_16816<T>(acc_s[2 * np], q_frag[ks], kb[0], kb[1]);
          mma_16816<T>(acc_s[2 * np + 1], q_frag[ks], kb[2], kb[3]);
        }
    } else {
      const float* q0 = s_q + (warp * 16 + lane / 4) * LD;
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
            acc_s[n][c] += x0.x * y.x + x0.y * y.y + x0.z * y.z + x0.w * y.w;
            acc_s[n][2 + c] += x1.x * y.x + x1.y * y.y + x1.z * y.z + x1.w * y.w;
          }
      }
    }

    // Bias, masks and the online softmax. Columns are relative to key j0 + 2 * (lane % 4),
    // so each element's column is a compile-time constant.
    bool inside = true;
#pragma unroll
    for (int k = 0; k < 2; ++k) inside = inside && fr[k].begin <= j0 && fr[k].end >= j0 + BN;
    const bool masked = has_key_mask || !__all_sync(0xffffffffu, inside);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const detail::tile_frame tf = detail::make_tile_frame(fr[k], j0 + 2 * tq, BN);
      float mx = neg_inf;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = n * 8 + c;
          float x = detail::score_l2(acc_s[n][2 * k + c], scale_l2, neg_slope_l2[k],
                                     detail::tile_distance(tf, static_cast<float>(col)));
          if (masked) {
            if (col < tf.begin || col >= tf.end) x = neg_inf;
            if (has_key_mask) x += s_key_bias[col + 2 * tq];
          }
          acc_s[n][2 * k + c] = x;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const detail::online_step st = detail::online_update(m[k], mx);
      m[k] = st.m;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float pv = detail::fast_exp2(acc_s[n][2 * k + c] - st.ref);
          acc_s[n][2 * k + c] = pv;
          sum += pv;
        }
      l[k] = l[k] * st.factor + sum;  // this thread's columns only; summed over the quad at the end
#pragma unroll
      for (int n = 0; n < DT; ++n) {
        acc_o[n][2 * k] *= st.factor;
        acc_o[n][2 * k + 1] *= st.factor;
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V(t) has landed; every warp is done with the K buffer
    if (t > tile_first) {
      stage_keys(s_k, a.k, j0 - BN, true);
      cp_async_commit();
    }

    // O += P V.
    if constexpr (Tr::tensor_cores) {
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        // The accumulators of two adjacent S tiles are exactly an A fragment (rows x 16 keys).
        const std::uint32_t pa[4] = {elem<T>::pack(acc_s[2 * kk][0], acc_s[2 * kk][1]),
                                     elem<T>::pack(acc_s[2 * kk][2], acc_s[2 * kk][3]),
                                     elem<T>::pack(acc_s[2 * kk + 1][0], acc_s[2 * kk + 1][1]),
                                     elem<T>::pack(acc_s[2 * kk + 1][2], acc_s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          std::uint32_t vb[4];
          const detail::lane_offset o = detail::ldsm_b_kmajor(lane);
          ldmatrix_x4_trans(vb, s_v + (kk * 16 + o.row) * LD + dp * 16 + o.col);
          mma_16816<T>(acc_o[2 * dp], pa, vb[0], vb[1]);
          mma_16816<T>(acc_o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
    } else {
      float* p0 = s_p + (warp * 16 + lane / 4) * Tr::p_ld;
      float* p1 = p0 + 8 * Tr::p_ld;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          p0[n * 8 + 2 * tq + c] = acc_s[n][c];
          p1[n * 8 + 2 * tq + c] = acc_s[n][2 + c];
        }
      __syncwarp();
#pragma unroll 4
      for (int j = 0; j < BN; ++j) {
        const float w0 = p0[j], w1 = p1[j];
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          const float2 y = *reinterpret_cast<const float2*>(s_v + j * LD + n * 8 + 2 * tq);
          acc_o[n][0] += w0 * y.x;
          acc_o[n][1] += w0 * y.y;
          acc_o[n][2] += w1 * y.x;
          acc_o[n][3] += w1 * y.y;
        }
      }
      __syncwarp();
    }
  }

  // Epilogue: sum l over the quad, normalize, and send rows whose result is not finite
  // through the careful path.
  bool bad[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
    const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
    bool finite = l[k] == l[k];
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = acc_o[n][2 * k + c] * inv;
        acc_o[n][2 * k + c] = x;
        finite = finite && isfinite(x);
      }
    bad[k] = row_in[k] && !finite;
  }
  const unsigned bad0 = __ballot_sync(0xffffffffu, bad[0]),
                 bad1 = __ballot_sync(0xffffffffu, bad[1]);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const unsigned quad_bad = ((k == 0 ? bad0 : bad1) >> (lane & ~3)) & 0xFu;
    if (!row_in[k] || quad_bad) continue;
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        writer.value(row_h[k], row_i[k], n * 8 + 2 * tq + c, acc_o[n][2 * k + c]);
    if (tq == 0) writer.stats(row_h[k], row_i[k], m[k], l[k], fr[k]);
  }
  if (bad0 | bad1) {
    for (int rr = 0; rr < 16; ++rr) {
      const unsigned mask = rr < 8 ? bad0 : bad1;
      if (((mask >> ((rr % 8) * 4)) & 0xFu) == 0) continue;
      const index_t r = row0 + warp * 16 + rr, i = r / group, h = kvh * group + r % group;
      const row_frame f = detail::make_row_frame(p, b, h, i);
      float o[D / 32], mm, ll;
      careful_row<T, D>(a, b, h, i, f, split * a.chunk, split * a.chunk + a.chunk, o, mm, ll);
#pragma unroll
      for (int u = 0; u < D / 32; ++u) writer.value(h, i, lane + 32 * u, o[u]);
      if (lane == 0) writer.stats(h, i, mm, ll, f);
    }
  }
}

/// Combines the split-KV partial results of each row: one warp per (batch, head, row).
template <class T>
__global__ void __launch_bounds__(128) merge_kernel(const fwd_args<T> a) {
  const attention_problem& p = a.p;
  const index_t rows = p.batch * p.q_heads * p.q_len;
  const index_t row = static_cast<index_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const index_t i = row % p.q_len, h = (row / p.q_len) % p.q_heads, b = row / (p.q_len * p.q_heads);
  const index_t stride = rows;  // between splits, in rows
  // max over the splits' logsumexps; a NaN one (a row that met NaN) makes the row NaN.
  float mx = detail::neg_inf_f();
  bool nan = false;
  for (index_t s = 0; s < a.splits; ++s) {
    const float x = a.part_lse[s * stride + row];
    nan = nan || x != x;
    mx = fmaxf(mx, x);
  }
  const bool none = mx == detail::neg_inf_f();
  float sum = nan ? detail::nan_f() : 0.0f;
  if (!none && !nan)
    for (index_t s = 0; s < a.splits; ++s)
      sum += detail::fast_exp2(a.part_lse[s * stride + row] - mx);
  for (index_t d = lane; d < p.head_dim; d += 32) {
    float x = nan ? sum : 0.0f;
    if (!none && !nan)
      for (index_t s = 0; s < a.splits; ++s) {
        // Splits with no weight are skipped: their partial output is 0 (or never formed).
        const float w = detail::merge_weight(a.part_lse[s * stride + row], mx, sum);
        if (w != 0.0f) x += w * a.part_o[(s * stride + row) * p.head_dim + d];
      }
    a.out(b, h, i, d) = elem<T>::from_float(x);
  }
  if (lane == 0 && p.lse.data) {
    const row_frame f = detail::make_row_frame(p, b, h, i);
    p.lse(b, h, i) = detail::finish_lse_l2(mx, none ? 0.0f : sum, f);
  }
}

}  // namespace cuda_detail
}  // namespace alibi
