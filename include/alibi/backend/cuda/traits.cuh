// SPDX-License-Identifier: MIT
// The forward kernel's compile-time configuration (kernel_tuning, kernel_traits) with its
// static invariants, the register tiles and row mapping it derives, and the kernel's
// arguments (fwd_args). Everything else in the CUDA backend's kernels is written in terms
// of a kernel_traits instance `Tr`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "alibi/core/problem.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/online_softmax.hpp"
#include "alibi/numerics/tile_frame.hpp"

namespace alibi {
namespace cuda_detail {

using detail::attention_problem;
using detail::row_frame;
using detail::softmax_state;

/// The tunable part of the kernel configuration (the defaults are the fastest measured; see
/// the README). A type rather than macros: it is part of kernel_traits, so the kernel of
/// every tuning is a distinct instantiation, and translation units that use different
/// tunings never hold two definitions of one type or kernel (no ODR violation). The
/// library's backend always uses kernel_tuning<>; the GPU benchmark passes others to the
/// internal entry point launch<T, D, Tuning> to compare configurations.
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
/// The instance without it visits every tile from the last to the first.
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

/// The forward kernel's arguments (trivially copyable).
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

}  // namespace cuda_detail
}  // namespace alibi
