// SPDX-License-Identifier: MIT
// The fused forward kernel of the CUDA backend (flash-attention style) and the split-KV
// merge kernel. One block handles block_m query rows of one (batch, kv head): the rows of
// every query head of that kv head's group, interleaved (packed row r = query i * group +
// head g), so that each K/V tile staged in shared memory serves the whole GQA group. Key
// tiles are visited from the last (nearest to causal queries) to the first; the instances
// with far-tile skipping visit them nearest-first and stop a side once the ALiBi bound
// (detail/far_tiles.hpp) shows the rest of it negligible for every row of the block.
//
// The kernel body is a sequence of named steps (device functions below): stage a K/V tile,
// S = Q K^T (compute_scores), the ALiBi bias and the masks (bias_and_masks, built on
// apply_bias_and_masks), the online softmax of the tile (softmax_tile, one
// detail::softmax_state per row), O += P V (accumulate_pv), and the epilogue (finish_rows:
// quad sums, the decoding warps' merge, normalization, the careful path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/mma_layout.hpp"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/numerics/far_tiles.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/score_tile.hpp"

namespace alibi {
namespace cuda_detail {

using detail::attention_problem;
using detail::row_frame;
using detail::softmax_state;

/// The tunable part of the kernel configuration (defaults measured on an H200; see the
/// README). A type rather than macros: it is part of kernel_traits, so the kernel of every
/// tuning is a distinct instantiation, and translation units that use different tunings
/// never hold two definitions of one type or kernel (no ODR violation). The library's
/// backend always uses kernel_tuning<>; the GPU benchmark passes others to the internal
/// entry point launch<T, D, Tuning> to compare configurations.
///  - Warps: warps per block of the general instance.
///  - MTiles: 16-row m tiles per warp (tensor-core general instance).
///  - MinBlocks: resident blocks per SM asked of the compiler (__launch_bounds__).
///  - BlockNWide: keys per tile for head dims above 64 (tensor-core general instance).
///  - QRegsLimit: Q fragments stay in registers when m_tiles * head_dim <= QRegsLimit.
/// The decoding instance has its own fixed configuration (only QRegsLimit applies to it).
template <int Warps = 4, int MTiles = 2, int MinBlocks = 1, int BlockNWide = 64,
          int QRegsLimit = 128>
struct kernel_tuning {
  static_assert(Warps >= 1 && Warps <= 32, "kernel_tuning: 1..32 warps per block");
  static_assert(MTiles >= 1, "kernel_tuning: at least one m tile per warp");
  static_assert(MinBlocks >= 1, "kernel_tuning: at least one resident block");
  static_assert(BlockNWide >= 16 && BlockNWide % 16 == 0,
                "kernel_tuning: BlockNWide is a positive multiple of 16");
  static constexpr int warps = Warps;
  static constexpr int m_tiles = MTiles;
  static constexpr int min_blocks = MinBlocks;
  static constexpr int block_n_wide = BlockNWide;
  static constexpr int q_regs_limit = QRegsLimit;
};

/// The compile-time configuration of one kernel instance. half/bfloat16 use tensor cores
/// (mma.sync m16n8k16, fp32 accumulation); float uses FMA with the same per-thread
/// ownership of score and output elements, so the softmax code is shared.
/// `Decode`: the instance for at most 16 packed query rows (decoding steps), where the
/// warps of a block split each key tile between them instead of the rows, and merge their
/// partial softmax states at the end; otherwise one warp computing for a single row would
/// set the pace of the whole block. Tensor-core types only.
/// `Tuning`: a kernel_tuning.
/// `Skip`: the instance with far-tile skipping (nearest-first tile order, the side tests).
/// The instance without it keeps today's order (last tile to first) and arithmetic.
template <class T, int D, bool Decode = false, class Tuning = kernel_tuning<>, bool Skip = false>
struct kernel_traits {
  static_assert(D % 32 == 0 && D >= 32 && D <= 128, "head dims 32, 64, 96, 128");
  using element = T;
  using tuning = Tuning;
  static constexpr bool skip = Skip;
  static constexpr bool tensor_cores = !std::is_same<T, float>::value;
  static_assert(!Decode || tensor_cores, "the decoding instance uses tensor cores");
  static constexpr int head_dim = D;
  static constexpr int warps = Decode ? 4 : Tuning::warps;
  static constexpr int threads = 32 * warps;
  static constexpr int min_blocks = Decode ? 2 : Tuning::min_blocks;  // resident blocks per SM
  static constexpr int key_warps = Decode ? warps : 1;                // warps sharing the same rows
  // 16-row m tiles per warp: two let every K/V fragment loaded from shared memory feed two
  // tensor-core products (half the shared-memory traffic per flop), at the cost of twice
  // the accumulator registers.
  static constexpr int m_tiles = tensor_cores && !Decode ? Tuning::m_tiles : 1;
  static constexpr int warp_rows = 16 * m_tiles;
  static constexpr int rows_per_thread = 2 * m_tiles;  // m tile mi: rows lane/4 and lane/4 + 8
  static constexpr int block_m = warp_rows * (warps / key_warps);  // packed query rows per block
  // Keys per tile: as many as the registers allow (the S tile is block_n / 8 accumulator
  // tiles per m tile), fewer for fp32 whose products come from shared memory.
  static constexpr int block_n = Decode ? 128
                                 : tensor_cores
                                     ? (D <= 64 ? (m_tiles == 1 ? 128 : 64) : Tuning::block_n_wide)
                                     : 32;
  static constexpr int warp_keys = block_n / key_warps;  // keys of a tile per warp
  static constexpr int n_tiles = warp_keys / 8;          // 16x8 accumulator tiles of S per m tile
  static constexpr int d_tiles = D / 8;                  // 16x8 accumulator tiles of O per m tile
  // Q fragments stay in registers when they fit beside the accumulators.
  static constexpr bool q_in_regs = tensor_cores && m_tiles * D <= Tuning::q_regs_limit;
  static constexpr int vec = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  // Shared-memory rows are padded by 16 bytes: the 8 rows an ldmatrix (or a 16-byte
  // load pass) touches then start in 8 different bank groups, without conflicts.
  static constexpr int ld = D + vec;
  static constexpr int p_ld = block_n + 4;  // fp32 P rows (FMA path only), padded likewise
  // Q, two K and two V tiles (the next tile loads while this one is used), the key-mask
  // flags of both, the fp32 P tile of the FMA path, and with skipping each row's
  // far_row_info, its two proposed cuts and the block's (search_cuts).
  static constexpr std::size_t p_bytes = tensor_cores ? 0 : sizeof(float) * block_m * p_ld;
  static constexpr std::size_t skip_bytes =
      Skip ? (sizeof(float4) + 2 * sizeof(long long)) * block_m + 4 * sizeof(long long) : 0;
  static constexpr std::size_t smem_bytes =
      sizeof(T) * static_cast<std::size_t>((block_m + 4 * block_n) * ld) +
      sizeof(float) * 2 * block_n + p_bytes + skip_bytes;
};

/// A warp's register tiles: the S accumulators (acc_s[mi][n][e] is row 16 mi +
/// acc_element(lane, e).row, key column 8 n + acc_element(lane, e).col of the warp's keys),
/// the O accumulators (the same with head-dim columns), the Q fragments kept in registers
/// (a dummy when Tr::q_in_regs is false), and the per-row state.
template <class Tr>
using score_acc = float[Tr::m_tiles][Tr::n_tiles][4];
template <class Tr>
using out_acc = float[Tr::m_tiles][Tr::d_tiles][4];
template <class Tr>
using q_fragments =
    std::uint32_t[Tr::q_in_regs ? Tr::m_tiles : 1][Tr::q_in_regs ? Tr::head_dim / 16 : 1][4];
template <class Tr>
using row_states = softmax_state[Tr::rows_per_thread];
template <class Tr>
using row_frames = detail::row_frame32[Tr::rows_per_thread];
template <class Tr>
using row_values = float[Tr::rows_per_thread];

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
  // Far-tile skipping (the Skip instances): per (batch, kv head), per block of
  // key_norm_block keys t, the largest key-norm bound of the keys [0, key_norm_block (t + 1))
  // (prefix) and [key_norm_block t, k_len) (suffix); (batch * kv_heads, norm_grid) each.
  const float* norm_prefix = nullptr;
  const float* norm_suffix = nullptr;
  index_t norm_grid = 0;
  // params.stats on the device: tiles computed, tiles skipped (added by each block).
  unsigned long long* counters = nullptr;
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

/// The packed rows of one warp: slot s of the threads whose lane / 4 is g holds packed row
/// row(s, g) = row 16 (s / 2) + g + 8 (s % 2) of the warp's rows, i.e. query row
/// query(r) = r / group of head head(r) = kv_head * group + r % group.
struct warp_row_map {
  index_t first = 0;        // the warp's first packed row
  index_t packed_rows = 0;  // q_len * group
  index_t group = 1, kv_head = 0;

  __device__ __forceinline__ index_t row(int s, int g) const {
    return first + 16 * (s / 2) + g + 8 * (s % 2);
  }
  __device__ __forceinline__ index_t query(index_t r) const { return r / group; }
  __device__ __forceinline__ index_t head(index_t r) const { return kv_head * group + r % group; }
};

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
  index_t tile_end = key_hi > key_lo ? (key_hi + BN - 1) / BN : tile_first;

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
  index_t computed = 0, skipped = 0;  // key tiles, for params.stats

  if constexpr (!Tr::skip) {
    // Every tile, from the last to the first.
    computed = tile_end - tile_first;
    if (tile_end > tile_first) {
      stage_rows<Tr>(s_q, BM, a.aligned, q_row);
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
      if constexpr (Tr::q_in_regs) {
        if (t == tile_end - 1) load_q_fragments<Tr>(q_frag, s_qw, lane);
      }
      compute_tile(t, buf);
      __syncthreads();  // every warp is done with buffer t % 2 before it is refilled
    }
  } else {
    // Far-tile skipping (Skip instances): the tiles are visited nearest-first from the tile of
    // the block's nearest key, and at a few points (after 1, 2, 4, 8, ... computed tiles) the
    // block searches how far each side must go (search_cuts); between the searches the walk
    // runs like the dense loop. Far chunks of split-KV first compute the scores of the tile
    // nearest the rows (the anchor): their own state is empty when they start, and the
    // anchor may show the whole chunk, or its far part, negligible; what is, is never read.
    unsigned char* const skip_base = reinterpret_cast<unsigned char*>(s_p) + Tr::p_bytes;
    const skip_smem sk{reinterpret_cast<float4*>(skip_base),
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM),
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM) + BM,
                       reinterpret_cast<long long*>(skip_base + sizeof(float4) * BM) + 2 * BM};
    bool info_ready = false;
    int searches = 0;
    tile_cuts cut{static_cast<std::int32_t>(tile_first), static_cast<std::int32_t>(tile_end)};
    // The block's nearest key: for the middle row's query position t0_mid (relative to key
    // 0), the nearest key that every row of the block may see (so that the first tile gives
    // every row some weight: under a causal mask, the first row's own position), else the
    // nearest key of any row.
    index_t near_all = 0;
    std::int32_t t0_mid = 0;
    {
      const index_t i_first = row0 / group;
      const index_t last_row = (row0 + BM < packed_rows ? row0 + BM : packed_rows) - 1;
      const index_t i_last = (last_row / group < lq ? last_row / group : lq - 1);
      if (i_first <= i_last) {
        const index_range r0 = p.key_range(b, i_first), r1 = p.key_range(b, i_last);
        const index_t all_lo = r0.begin, all_hi = r1.end < lk ? r1.end : lk;
        index_t lo = r1.begin > all_lo ? r1.begin : all_lo, hi = r0.end < all_hi ? r0.end : all_hi;
        if (lo >= hi) lo = all_lo, hi = all_hi;
        const index_t mid = p.q_offset(b) + (i_first + i_last) / 2 - p.k_offset(b);
        near_all = mid < lo ? lo : mid >= hi ? hi - 1 : mid;
        // Only the order of the tiles depends on it: clamped to 32 bits (keys below 2^28).
        t0_mid = static_cast<std::int32_t>(
            detail::clamp_index(mid, -(index_t(1) << 30), index_t(1) << 30));
      }
    }
    std::int32_t center = static_cast<std::int32_t>(tile_end - 1);
    if (tile_end > tile_first) {
      center = static_cast<std::int32_t>((near_all < key_lo    ? key_lo
                                          : near_all >= key_hi ? key_hi - 1
                                                               : near_all) /
                                         BN);
      if (near_all < key_lo || near_all >= key_hi) {
        const index_t ta = near_all / BN;
        row_states<Tr> anchor;
        stage_rows<Tr>(s_q, BM, a.aligned, q_row);
        stage_tile(ta, 0, false);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        far_row_info<Tr>(a, b, kvh, row0, s_q, sk);
        if (warp_active) {
          if constexpr (Tr::q_in_regs) load_q_fragments<Tr>(q_frag, s_qw, lane);
          score_acc<Tr> acc_s;
          compute_scores<Tr>(acc_s, s_qw, s_k0, q_frag, koff, lane);
          bias_and_masks<Tr>(acc_s, fr, static_cast<std::int32_t>(ta * BN), koff + 2 * tq, scale_l2,
                             neg_slope_l2, has_key_mask, s_flags0);
          tile_states<Tr>(acc_s, anchor);
        } else {
#pragma unroll
          for (int s = 0; s < R; ++s) anchor[s] = softmax_state{};
        }
        __syncthreads();  // s_info is complete, and buffer 0 is free again
        info_ready = true;
        // The chunk lies on one side of the rows' nearest key: nothing of it computed yet, the
        // walk would start at its near end. Each side test bounds the whole tail of that side
        // beyond its point (every key at that distance or more), not only this chunk's keys,
        // so the weight all the chunks and tiles skipped on one side is at most the tail of
        // the nearest point skipped there: the bounds nest rather than add up.
        const std::int32_t tl = near_all >= key_hi ? cut.hi : cut.lo;
        cut = search_cuts<Tr>(a, rows, b, row0, fr, anchor, sk, searches++ & 1, cut, tl, tl - 1);
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
      if (!info_ready) stage_rows<Tr>(s_q, BM, a.aligned, q_row);  // else the anchor staged Q
      stage_tile(t, 0, true);
      cp_async_commit();
    }
    for (int buf = 0; t >= 0; buf ^= 1) {
      // A search once 1, 2, 4, ... tiles are done (with the rows' states after them), at the
      // top of an iteration: every warp has passed the previous iteration's last barrier.
      if (info_ready && computed > 0 && (computed & (computed - 1)) == 0)
        cut = search_cuts<Tr>(a, rows, b, row0, fr, st, sk, searches++ & 1, cut, tl, tr);
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
        far_row_info<Tr>(a, b, kvh, row0, s_q, sk);  // visible after this iteration
        info_ready = true;
      }
      ++computed;
      if (warp_active) {
        if constexpr (Tr::q_in_regs) {
          if (computed == 1) load_q_fragments<Tr>(q_frag, s_qw, lane);
        }
        compute_tile(t, buf);
      }
      __syncthreads();  // every warp is done with buffer buf before it is refilled
      t = next;
    }
    skipped = (tile_end - tile_first) - computed;
  }
  // params.stats: the anchor tile (scores only) is not counted, so that computed + skipped
  // is the dense count.
  if (a.counters != nullptr && threadIdx.x == 0) {
    atomicAdd(a.counters, static_cast<unsigned long long>(computed));
    if (skipped > 0) atomicAdd(a.counters + 1, static_cast<unsigned long long>(skipped));
  }

  finish_rows<Tr>(a, writer, st, acc_o, rows, reinterpret_cast<float*>(s_k0), computed == 0);
}

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
