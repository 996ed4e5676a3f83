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
#include "alibi/backend/cuda/mma_layout.hpp"
#include "alibi/detail/score_tile.hpp"

// Tuning knobs of the kernel configuration (defaults measured on an H200; see the README).
#ifndef ALIBI_CUDA_WARPS
#define ALIBI_CUDA_WARPS 4
#endif
#ifndef ALIBI_CUDA_M_TILES
#define ALIBI_CUDA_M_TILES 2
#endif
#ifndef ALIBI_CUDA_MIN_BLOCKS
#define ALIBI_CUDA_MIN_BLOCKS 1
#endif
#ifndef ALIBI_CUDA_BLOCK_N_WIDE
#define ALIBI_CUDA_BLOCK_N_WIDE 64
#endif
#ifndef ALIBI_CUDA_Q_REGS_LIMIT
#define ALIBI_CUDA_Q_REGS_LIMIT 128
#endif

namespace alibi {
namespace cuda_detail {

using detail::attention_problem;
using detail::row_frame;

/// The compile-time configuration of one kernel instance. half/bfloat16 use tensor cores
/// (mma.sync m16n8k16, fp32 accumulation); float uses FMA with the same per-thread
/// ownership of score and output elements, so the softmax code is shared.
/// `Decode`: the instance for at most 16 packed query rows (decoding steps), where the
/// warps of a block split each key tile between them instead of the rows, and merge their
/// partial softmax states at the end; otherwise one warp computing for a single row would
/// set the pace of the whole block. Tensor-core types only.
template <class T, int D, bool Decode = false>
struct kernel_traits {
  static_assert(D % 32 == 0 && D >= 32 && D <= 128, "head dims 32, 64, 96, 128");
  using element = T;
  static constexpr bool tensor_cores = !std::is_same<T, float>::value;
  static_assert(!Decode || tensor_cores, "the decoding instance uses tensor cores");
  static constexpr int head_dim = D;
  static constexpr int warps = Decode ? 4 : ALIBI_CUDA_WARPS;
  static constexpr int threads = 32 * warps;
  static constexpr int min_blocks = Decode ? 2 : ALIBI_CUDA_MIN_BLOCKS;  // resident blocks per SM
  static constexpr int key_warps = Decode ? warps : 1;  // warps sharing the same rows
  // 16-row m tiles per warp: two let every K/V fragment loaded from shared memory feed two
  // tensor-core products (half the shared-memory traffic per flop), at the cost of twice
  // the accumulator registers.
  static constexpr int m_tiles = tensor_cores && !Decode ? ALIBI_CUDA_M_TILES : 1;
  static constexpr int warp_rows = 16 * m_tiles;
  static constexpr int block_m = warp_rows * (warps / key_warps);  // packed query rows per block
  // Keys per tile: as many as the registers allow (the S tile is block_n / 8 accumulator
  // tiles per m tile), fewer for fp32 whose products come from shared memory.
  static constexpr int block_n =
      Decode         ? 128
      : tensor_cores ? (D <= 64 ? (m_tiles == 1 ? 128 : 64) : ALIBI_CUDA_BLOCK_N_WIDE)
                     : 32;
  static constexpr int warp_keys = block_n / key_warps;  // keys of a tile per warp
  static constexpr int n_tiles = warp_keys / 8;          // 16x8 accumulator tiles of S per m tile
  static constexpr int d_tiles = D / 8;                  // 16x8 accumulator tiles of O per m tile
  // Q fragments stay in registers when they fit beside the accumulators.
  static constexpr bool q_in_regs = tensor_cores && m_tiles * D <= ALIBI_CUDA_Q_REGS_LIMIT;
  static constexpr int vec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  // Shared-memory rows are padded by 16 bytes: the 8 rows an ldmatrix (or a 16-byte
  // load pass) touches then start in 8 different bank groups, without conflicts.
  static constexpr int ld = D + vec;
  static constexpr int p_ld = block_n + 4;  // fp32 P rows (FMA path only), padded likewise
  // Q, two K and two V tiles (the next tile loads while this one is used), the key-mask
  // flags of both, and the fp32 P tile of the FMA path.
  static constexpr std::size_t smem_bytes =
      sizeof(T) * static_cast<std::size_t>((block_m + 4 * block_n) * ld) +
      sizeof(float) * 2 * block_n + (tensor_cores ? 0 : sizeof(float) * block_m * p_ld);
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
__global__ void __launch_bounds__(Tr::threads, Tr::min_blocks)
    attention_kernel(const fwd_args<typename Tr::element> a) {
  using T = typename Tr::element;
  constexpr int D = Tr::head_dim, BM = Tr::block_m, BN = Tr::block_n, LD = Tr::ld;
  constexpr int NT = Tr::n_tiles, DT = Tr::d_tiles, MI = Tr::m_tiles, WR = Tr::warp_rows;
  constexpr int KW = Tr::key_warps;
  constexpr int R = 2 * MI;  // rows per thread: m tile mi holds rows lane/4 and lane/4 + 8
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
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tq = lane % 4;
  // Warps split the rows, or (decoding) each key tile: wrow is the warp's row group, koff
  // the first of its keys within a tile.
  const int wrow = warp / KW, koff = (warp % KW) * Tr::warp_keys;
  const bool has_key_mask = p.key_mask.data != nullptr;
  const row_writer<T> writer{a, split, b};

  // This thread's rows: slot s = 2 mi + k is packed row row_of(s), i.e. row 16 mi +
  // lane/4 + 8 k of the warp's rows. Kept compact (32-bit frames): registers are scarce.
  auto row_of = [&](int s) { return row0 + wrow * WR + 16 * (s / 2) + lane / 4 + 8 * (s % 2); };
  detail::row_frame32 fr[R];
  float m[R], l[R], neg_slope_l2[R];
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const index_t r = row_of(s);
    const row_frame f = r < packed_rows
                            ? detail::make_row_frame(p, b, kvh * group + r % group, r / group)
                            : row_frame{};
    fr[s] = detail::make_row_frame32(f);
    m[s] = neg_inf;
    l[s] = 0.0f;
    neg_slope_l2[s] = -f.slope * detail::log2e_f;
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

  float acc_o[MI][DT][4];
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
  // Stages key tile t (K, V and the key-mask flags) into buffer t % 2. Keys past the
  // length and keys the mask excludes are zero-filled, never read.
  auto stage_tile = [&](index_t t) {
    const index_t j0 = t * BN;
    const int buf = static_cast<int>(t & 1);
    auto key_row = [&](const T* base, index_t stride) {
      return [=, &p](int r) -> const T* {
        const index_t j = j0 + r;
        return j < lk && !(has_key_mask && p.key_mask(b, j)) ? base + j * stride : nullptr;
      };
    };
    stage_rows<Tr>(s_k0 + buf * BN * LD, BN, a.aligned, key_row(k_base, k_stride));
    stage_rows<Tr>(s_v0 + buf * BN * LD, BN, a.aligned, key_row(v_base, v_stride));
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

  std::uint32_t q_frag[Tr::q_in_regs ? MI : 1][Tr::q_in_regs ? D / 16 : 1][4];
  if (tile_end > tile_first) {
    stage_rows<Tr>(s_q, BM, a.aligned, q_row);
    stage_tile(tile_end - 1);
    cp_async_commit();
  }
  for (index_t t = tile_end - 1; t >= tile_first; --t) {
    const std::int32_t j0 = static_cast<std::int32_t>(t * BN);  // k_len < 2^28
    const int buf = static_cast<int>(t & 1);
    const T* s_k = s_k0 + buf * BN * LD;
    const T* s_v = s_v0 + buf * BN * LD;
    const float* s_flags = s_flags0 + buf * BN;
    // Prefetch the next tile into the other buffer (free: every warp passed the barrier at
    // the end of the previous iteration), then wait for this one only.
    if (t > tile_first) {
      stage_tile(t - 1);
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
    const detail::lane_offset qo = detail::ldsm_a(lane);
    if constexpr (Tr::q_in_regs) {
      if (t == tile_end - 1) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int ks = 0; ks < D / 16; ++ks)
            ldmatrix_x4(q_frag[mi][ks], s_qw + (16 * mi + qo.row) * LD + ks * 16 + qo.col);
      }
    }

    // S = Q K^T for this warp's rows: acc_s[mi][n][e] is row 16 mi + acc_element(lane,
    // e).row, key column 8 n + acc_element(lane, e).col.
    float acc_s[MI][NT][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mi][n][e] = 0.0f;
    if constexpr (Tr::tensor_cores) {
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
        for (int np = 0; np < NT / 2; ++np) {
          std::uint32_t kb[4];
          ldmatrix_x4(kb, s_k + (koff + np * 16 + ko.row) * LD + ks * 16 + ko.col);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            mma_16816<T>(acc_s[mi][2 * np], qa[mi], kb[0], kb[1]);
            mma_16816<T>(acc_s[mi][2 * np + 1], qa[mi], kb[2], kb[3]);
          }
        }
      }
    } else {
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

    // Bias, masks and the online softmax. Columns are relative to key j0 + 2 * (lane % 4),
    // so each element's column is a compile-time constant.
    bool inside = true, left = true, right = true;
#pragma unroll
    for (int s = 0; s < R; ++s) {
      inside = inside && fr[s].begin <= j0 && fr[s].end >= j0 + BN;
      // Every key of the tile on one side of the query (a + b = 2 t when not clamped):
      // the distance is a - c (left) or c - b (right) for every column.
      const detail::tile_frame tf = detail::make_tile_frame(fr[s], j0, BN);
      left = left && tf.a + tf.b >= 2.0f * (BN - 1);
      right = right && tf.a + tf.b <= 0.0f;
    }
    const bool masked = has_key_mask || !__all_sync(0xffffffffu, inside);
    // 0: general max(a - c, c - b); 1: a - c; 2: c - b. The same float operations as
    // tile_distance on its chosen side, so results do not depend on the path.
    const int side = __all_sync(0xffffffffu, left) ? 1 : __all_sync(0xffffffffu, right) ? 2 : 0;
    // Scores in base 2 with bias and masks, one instance per side (side is warp-uniform).
    auto score_tile = [&](auto side_tag) {
      constexpr int sd = decltype(side_tag)::value;
#pragma unroll
      for (int s = 0; s < R; ++s) {
        const int mi = s / 2, k = s % 2;
        const detail::tile_frame tf = detail::make_tile_frame(fr[s], j0 + koff + 2 * tq, BN);
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int col = n * 8 + c;
            const float fc = static_cast<float>(col);
            const float dist = sd == 1   ? tf.a - fc
                               : sd == 2 ? fc - tf.b
                                         : detail::tile_distance(tf, fc);
            float x = detail::score_l2(acc_s[mi][n][2 * k + c], scale_l2, neg_slope_l2[s], dist);
            if (masked) {
              if (col < tf.begin || col >= tf.end) x = neg_inf;
              if (has_key_mask) x += s_flags[koff + col + 2 * tq];
            }
            acc_s[mi][n][2 * k + c] = x;
          }
      }
    };
    if (side == 1)
      score_tile(std::integral_constant<int, 1>{});
    else if (side == 2)
      score_tile(std::integral_constant<int, 2>{});
    else
      score_tile(std::integral_constant<int, 0>{});
#pragma unroll
    for (int s = 0; s < R; ++s) {
      const int mi = s / 2, k = s % 2;
      float mx = neg_inf;
#pragma unroll
      for (int n = 0; n < NT; ++n)
        mx = fmaxf(mx, fmaxf(acc_s[mi][n][2 * k], acc_s[mi][n][2 * k + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const detail::online_step st = detail::online_update(m[s], mx);
      m[s] = st.m;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float pv = detail::fast_exp2(acc_s[mi][n][2 * k + c] - st.ref);
          acc_s[mi][n][2 * k + c] = pv;
          sum += pv;
        }
      l[s] = l[s] * st.factor + sum;  // this thread's columns only; summed over the quad at the end
      // Nearest tiles come first, so the maximum rarely grows after the first tile: skip
      // the rescale when no row of the warp needs it.
      if (!__all_sync(0xffffffffu, st.factor == 1.0f)) {
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          acc_o[mi][n][2 * k] *= st.factor;
          acc_o[mi][n][2 * k + 1] *= st.factor;
        }
      }
    }

    // O += P V.
    if constexpr (Tr::tensor_cores) {
      const detail::lane_offset vo = detail::ldsm_b_kmajor(lane);
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        // The accumulators of two adjacent S tiles are exactly an A fragment (rows x 16 keys).
        std::uint32_t pa[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi) {
          pa[mi][0] = elem<T>::pack(acc_s[mi][2 * kk][0], acc_s[mi][2 * kk][1]);
          pa[mi][1] = elem<T>::pack(acc_s[mi][2 * kk][2], acc_s[mi][2 * kk][3]);
          pa[mi][2] = elem<T>::pack(acc_s[mi][2 * kk + 1][0], acc_s[mi][2 * kk + 1][1]);
          pa[mi][3] = elem<T>::pack(acc_s[mi][2 * kk + 1][2], acc_s[mi][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
          std::uint32_t vb[4];
          ldmatrix_x4_trans(vb, s_v + (koff + kk * 16 + vo.row) * LD + dp * 16 + vo.col);
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            mma_16816<T>(acc_o[mi][2 * dp], pa[mi], vb[0], vb[1]);
            mma_16816<T>(acc_o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
          }
        }
      }
    } else {
      float* p0 = s_p + (wrow * WR + lane / 4) * Tr::p_ld;
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
    __syncthreads();  // every warp is done with buffer t % 2 before it is refilled
  }

  // Epilogue: sum l over the quad, merge the key warps' states (decoding), normalize, and
  // send rows whose result is not finite through the careful path.
#pragma unroll
  for (int s = 0; s < R; ++s) {
    l[s] += __shfl_xor_sync(0xffffffffu, l[s], 1);
    l[s] += __shfl_xor_sync(0xffffffffu, l[s], 2);
  }
  if constexpr (KW > 1) {
    static_assert(MI == 1, "key warps share one m tile");
    // Every warp passed the loop's last barrier (or never entered it): the K buffers are
    // free. Layout: m and l (KW, 16), then O (KW, 16, D), fp32.
    float* red = reinterpret_cast<float*>(s_k0);
    const int w = warp % KW;
    if (tile_end <= tile_first) __syncthreads();
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int row = lane / 4 + 8 * s;
      if (tq == 0) {
        red[w * 16 + row] = m[s];
        red[KW * 16 + w * 16 + row] = l[s];
      }
#pragma unroll
      for (int n = 0; n < DT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          red[2 * KW * 16 + (w * 16 + row) * D + n * 8 + 2 * tq + c] = acc_o[0][n][2 * s + c];
    }
    __syncthreads();
    if (w != 0) return;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int row = lane / 4 + 8 * s;
      float mx = neg_inf;
      for (int v = 0; v < KW; ++v) mx = fmaxf(mx, red[v * 16 + row]);
      float lsum = 0.0f;
#pragma unroll
      for (int n = 0; n < DT; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) acc_o[0][n][2 * s + c] = 0.0f;
      for (int v = 0; v < KW; ++v) {
        const detail::online_step st = detail::online_update(red[v * 16 + row], mx);
        lsum += red[KW * 16 + v * 16 + row] * st.factor;
#pragma unroll
        for (int n = 0; n < DT; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            acc_o[0][n][2 * s + c] +=
                red[2 * KW * 16 + (v * 16 + row) * D + n * 8 + 2 * tq + c] * st.factor;
      }
      m[s] = mx;
      l[s] = lsum;
    }
  }
  unsigned bad_mask[R];
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const int mi = s / 2, k = s % 2;
    const float inv = l[s] > 0.0f ? 1.0f / l[s] : 0.0f;
    bool finite = l[s] == l[s];
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float x = acc_o[mi][n][2 * k + c] * inv;
        acc_o[mi][n][2 * k + c] = x;
        finite = finite && isfinite(x);
      }
    bad_mask[s] = __ballot_sync(0xffffffffu, row_of(s) < packed_rows && !finite);
  }
  unsigned any_bad = 0;
#pragma unroll
  for (int s = 0; s < R; ++s) {
    const int mi = s / 2, k = s % 2;
    any_bad |= bad_mask[s];
    const unsigned quad_bad = (bad_mask[s] >> (lane & ~3)) & 0xFu;
    const index_t r = row_of(s), i = r / group, h = kvh * group + r % group;
    if (r >= packed_rows || quad_bad) continue;
#pragma unroll
    for (int n = 0; n < DT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) writer.value(h, i, n * 8 + 2 * tq + c, acc_o[mi][n][2 * k + c]);
    if (tq == 0) writer.stats(h, i, m[s], l[s], detail::make_row_frame(p, b, h, i));
  }
  if (any_bad) {
    for (int s = 0; s < R; ++s)
      for (int g = 0; g < 8; ++g) {
        if (((bad_mask[s] >> (4 * g)) & 0xFu) == 0) continue;
        const index_t r = row0 + wrow * WR + 16 * (s / 2) + g + 8 * (s % 2);
        const index_t i = r / group, h = kvh * group + r % group;
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
