// SPDX-License-Identifier: MIT
// K and V as the fused CPU kernel reads them: fp32 in place, fp16 / bf16 converted tile by
// tile into per-thread fp32 buffers for the GEMMs (the small-row products of decoding widen
// them in registers instead, small_rows.hpp). Scores, softmax and accumulation stay fp32
// whatever the storage; half-precision storage halves the bytes a memory-bound decode step
// streams.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/backend/host/simd.hpp"
#include "alibi/backend/host/workspace.hpp"
#include "alibi/core/config.hpp"
#include "alibi/core/key_blocks.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/far_tiles.hpp"

namespace alibi {
namespace detail {
namespace cpu {

inline namespace ALIBI_CPU_ISA {

/// dst[0, n) = src[0, n) as floats, a packet at a time (load_floats: Eigen's F16C / shift
/// conversion where it vectorizes the type), then the scalar tail. Both conversions are
/// exact (every half and bfloat16 value is a float); the vector and scalar paths give the
/// same floats for every bit pattern except signalling NaNs, which F16C returns quieted (a
/// NaN either way).
template <class T>
void to_float(const T* src, float* dst, index_t n) {
  index_t i = 0;
  for (; i + lanes <= n; i += lanes) Eigen::internal::pstoreu(dst + i, load_floats(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void to_float(const float* src, float* dst, index_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

using kv_row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using kv_rows_map = Eigen::Map<const kv_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// The K and V rows of one key tile, as fp32 matrices: k (bk, D), v (bk, Dv).
struct kv_tile {
  kv_rows_map k, v;
};

/// Per-thread fp32 copies of one K tile and one V tile (half-precision storage only).
struct kv_tile_buffers {
  aligned_buffer<float> k, v;
  static kv_tile_buffers& local() {
    thread_local kv_tile_buffers b;
    return b;
  }
};

/// Rows of a key tile in their storage type: row j at data + j * ld. Or, for K in blocks
/// (`blocked`, key_blocks.hpp), the blocks that hold the tile's keys: block u (a row-major
/// (D, 16) matrix) at data + u * ld, the tile's first key at lane `offset` of block 0.
template <class T>
struct tile_rows {
  const T* data;
  index_t ld;
  bool blocked = false;
  index_t offset = 0;
};

/// Requests the K and V rows of the next key tile from memory while the products work on
/// the tile in hand: its K lines a few at a time at the ticks of Q K^T (tick<keys_phase>),
/// its V lines at the ticks of P V (tick<values_phase>), each spread over as many ticks as
/// that product made on the last tile.
///
/// Why spread: a core has few line-fill buffers, and a burst of requests (a tile's K during
/// the first rows' Q K^T, a block of V rows before their P V) holds the arithmetic until most
/// of its lines have arrived, so a tile then takes its compute time plus its memory time.
/// Spread over the arithmetic, the requests overlap with it instead.
///
/// Why a tick is a fixed count of requests from a pointer, with no schedule: it runs inside
/// the products' FMA chains, where a schedule's bookkeeping (one queue of K then V pieces,
/// each tick weighed by its keys, a period and a due count) slowed the products themselves.
/// Measurements: docs/journal/2026-12-design-measurements.md, "kv_tiles.hpp: paced_prefetch".
class paced_prefetch {
 public:
  /// Which product a tick comes from: Q K^T requests the next K, P V the next V.
  enum phase : int { keys_phase = 0, values_phase = 1 };

  /// The rows to request: the K rows of n keys (n rows of d elements, or the blocks that
  /// hold them), then n rows of dv elements from v.
  template <class T>
  void plan(tile_rows<T> k, index_t d, tile_rows<T> v, index_t dv, index_t n) {
    if (n <= 0) {
      plan_nothing();
      return;
    }
    constexpr auto size = static_cast<index_t>(sizeof(T));
    const index_t k_rows = k.blocked ? key_block_count(k.offset + n) : n;
    const index_t k_width = k.blocked ? d * keys_per_block : d;
    streams_[keys_phase].plan(reinterpret_cast<std::uintptr_t>(k.data), k.ld * size, k_width * size,
                              k_rows);
    streams_[values_phase].plan(reinterpret_cast<std::uintptr_t>(v.data), v.ld * size, dv * size,
                                n);
  }

  /// Nothing to request: there is no next tile.
  void plan_nothing() {
    for (request_stream& s : streams_) s.plan_nothing();
  }

  /// The requests of one product alone, the other's plan left as it is: the bytes [begin,
  /// begin + bytes) as one run of lines (widened to whole lines), spread over as many ticks
  /// as that product made in its last run; nothing when bytes is 0. For reads that go
  /// through memory in one ascending run, block after block (the small calls that take the
  /// rows of every KV head of a block of keys together, attention_kernel.hpp).
  template <int Phase>
  void plan_run(const void* begin, index_t bytes) {
    if (bytes <= 0) {
      streams_[Phase].plan_nothing();
      return;
    }
    const auto at = reinterpret_cast<std::uintptr_t>(begin);
    const std::uintptr_t first = at / 64 * 64;
    const auto run =
        static_cast<index_t>((at + static_cast<std::uintptr_t>(bytes) - first + 63) / 64 * 64);
    streams_[Phase].plan(first, run, run, 1);
  }

  /// finish() for one product's requests alone.
  template <int Phase>
  void finish_run() {
    streams_[Phase].finish();
  }

  /// A step of one product: the next chunks of its stream.
  template <int Phase>
  ALIBI_FORCEINLINE void tick() {
    streams_[Phase].tick();
  }

  /// Requests what is left of the plan, and keeps the tile's tick counts for the next plan.
  void finish() {
    for (request_stream& s : streams_) s.finish();
  }

 private:
  /// The lines of one product's next rows: `left` chunks of `lines` lines, `stride` bytes
  /// apart, per_tick chunks per tick. The addresses are integers: the runs may start before
  /// the rows' first line and end past their last (a prefetch never faults), which pointer
  /// arithmetic may not.
  struct request_stream {
    std::uintptr_t at = 0;
    index_t stride = 0, lines = 0, left = 0, per_tick = 1, ticks = 0, last_ticks = 0;

    /// rows rows of `bytes` bytes, ld bytes apart.
    void plan(std::uintptr_t data, index_t ld, index_t bytes, index_t rows) {
      at = data;
      if (ld == bytes && bytes % 64 == 0) {
        // One contiguous run (a dense cache): one chunk per tick, as many lines as spread
        // the run over the ticks of the last tile (the first tile: 4 lines, the rest at
        // finish()). The last chunk may reach a few lines past the run: a prefetch never
        // faults, whatever the address.
        const index_t run = bytes / 64 * rows;
        lines = last_ticks > 0 ? std::max<index_t>(1, (run + last_ticks - 1) / last_ticks) : 4;
        stride = 64 * lines;
        left = (run + lines - 1) / lines;
        per_tick = 1;
      } else {  // whole rows, as many per tick as spread them over the ticks of the last tile
        lines = (bytes + 63) / 64;
        stride = ld;
        left = rows;
        per_tick = last_ticks > 0 ? (rows + last_ticks - 1) / last_ticks : 1;
      }
      ticks = 0;
    }

    void plan_nothing() {
      left = 0;
      ticks = 0;
    }

    ALIBI_FORCEINLINE void tick() {
      ++ticks;
      for (index_t c = 0; c < per_tick && left > 0; ++c) request_chunk();
    }

    void finish() {
      while (left > 0) request_chunk();
      last_ticks = ticks;
    }

    ALIBI_FORCEINLINE void request_chunk() {
      for (index_t l = 0; l < lines; ++l) {
        // Into L1 and L2 (prefetcht0 on x86). The lines of a whole tile do not all stay in
        // L1, but each arrives there instead of one level further, which made half-precision
        // decode steps faster than prefetcht1 did (docs/journal/2026-12-design-measurements.md,
        // "kv_tiles.hpp: paced_prefetch::request_stream::request_chunk").
        __builtin_prefetch(reinterpret_cast<const void*>(at + static_cast<std::uintptr_t>(64 * l)),
                           0, 3);
        // GCC may delete a loop that only prefetches (to it a prefetch has no effect); an
        // empty volatile asm statement keeps every request.
        asm volatile("");
      }
      at += static_cast<std::uintptr_t>(stride);
      --left;
    }
  };

  request_stream streams_[2];
};

/// K (B, Hkv, Lk, D) and V (B, Hkv, Lk, Dv) of a call in storage type T; K either as rows
/// (k) or in blocks (kb: (B, Hkv, ceil(Lk / 16), D, 16), key_blocks.hpp; k then gives only
/// the shape).
template <class T>
struct kv_source {
  tensor_view<const T, 4> k, v;
  tensor_view<const T, 5> kb{};

  bool blocked() const { return holds_key_blocks(kb); }

  /// Whether the heads of t interleave: two or more, a head's stride shorter than its rows.
  static bool interleaved(const tensor_view<const T, 4>& t) {
    return t.extents[1] > 1 && std::abs(t.strides[1]) < t.extents[2] * std::abs(t.strides[2]);
  }

  /// Whether the KV heads' rows interleave in memory (the tokens outermost, as in
  /// (batch, seq, heads, dim) memory): two heads or more, a head's stride shorter than its
  /// k_len rows. K in blocks is one run per head; V (and K as rows) are asked.
  bool heads_interleave() const { return interleaved(v) || keys_interleave(); }

  /// Whether K's rows (as rows, not in blocks) interleave so.
  bool keys_interleave() const { return !blocked() && interleaved(k); }

  /// The bytes from one token's row of a KV head to the next's, the larger of V's and (as
  /// rows) K's: with interleaved heads, the memory a pass over n keys spans is n times this.
  index_t token_bytes() const {
    auto bytes = [](const auto& t) { return std::abs(t.strides[2]) * index_t(sizeof(T)); };
    return blocked() ? bytes(v) : std::max(bytes(v), bytes(k));
  }

  /// With the tokens outermost, K (keys, as rows) or V: the elements from the first to the
  /// last of one token's rows of all KV heads, and where they start at key j of batch entry b.
  index_t token_span(bool keys) const {
    const tensor_view<const T, 4>& t = keys ? k : v;
    return (t.extents[1] - 1) * std::abs(t.strides[1]) + t.extents[3];
  }
  const T* token_rows(bool keys, index_t b, index_t j) const {
    const tensor_view<const T, 4>& t = keys ? k : v;
    return t.ptr(b, t.strides[1] >= 0 ? 0 : t.extents[1] - 1, j);
  }

  /// Whether the rows of every KV head of a block of keys make one run of memory, or
  /// nearly: the tokens outermost (heads_interleave), K as rows, each token's rows of all
  /// heads in ascending tokens and covering at least three quarters of the token stride (a
  /// dense (batch, seq, heads, dim) tensor covers all of it; rows padded a little, most of
  /// it; K and V of one (batch, seq, 2, heads, dim) tensor, half).
  bool token_rows_packed() const {
    auto packed = [](const auto& t, index_t span) {
      return t.strides[2] > 0 && span <= t.strides[2] && 4 * span >= 3 * t.strides[2];
    };
    return !blocked() && heads_interleave() && packed(k, token_span(true)) &&
           packed(v, token_span(false));
  }

  /// The keys of a block in the small calls that take every KV head together
  /// (small_tile_kv_heads): about kernel_config::kv_heads_block_bytes of each of K and V,
  /// 16 to 32 keys, a multiple of 4 (the small-row products go 4 keys at a time).
  index_t token_block_keys() const {
    using cfg = kernel_config;
    return std::clamp(cfg::kv_heads_block_bytes / std::max<index_t>(token_bytes(), 1),
                      cfg::min_kv_heads_block_keys, cfg::max_kv_heads_block_keys) /
           4 * 4;
  }

  /// The bytes of the run that keys [j, j + n) of all KV heads span from token_rows(keys,
  /// b, j) (0 for no keys).
  index_t token_run_bytes(bool keys, index_t n) const {
    const tensor_view<const T, 4>& t = keys ? k : v;
    return n > 0 ? ((n - 1) * t.strides[2] + token_span(keys)) * index_t(sizeof(T)) : 0;
  }

  /// The K (keys) or V rows of (b, hk) from key j0 on, in place (K in blocks: the blocks
  /// from the one holding j0 on).
  tile_rows<T> rows(bool keys, index_t b, index_t hk, index_t j0) const {
    if (keys && blocked())
      return {kb.ptr(b, hk, j0 / keys_per_block), kb.strides[2], true, j0 % keys_per_block};
    const tensor_view<const T, 4>& t = keys ? k : v;
    return {t.ptr(b, hk, j0), t.strides[2]};
  }

  /// Keys [j0, j0 + bk) of (b, hk): views of the memory for float, otherwise converted into
  /// the calling thread's buffers (valid until its next tile() call).
  kv_tile tile(index_t b, index_t hk, index_t j0, index_t bk) const {
    const index_t d = k.extents[3], dv = v.extents[3];
    if constexpr (std::is_same<T, float>::value) {
      const kv_rows_map vm(v.ptr(b, hk, j0), bk, dv, Eigen::OuterStride<>(v.strides[2]));
      if (blocked()) {  // K in blocks: transposed into rows, V in place
        kv_tile_buffers& buf = kv_tile_buffers::local();
        const index_t ldk = padded_stride(std::max<index_t>(d, 1));
        buf.k.reserve(static_cast<std::size_t>(kernel_config::block_k * ldk));
        to_floats(true, b, hk, j0, bk, buf.k.data(), ldk);
        return {kv_rows_map(buf.k.data(), bk, d, Eigen::OuterStride<>(ldk)), vm};
      }
      return {kv_rows_map(k.ptr(b, hk, j0), bk, d, Eigen::OuterStride<>(k.strides[2])), vm};
    } else {
      kv_tile_buffers& buf = kv_tile_buffers::local();
      // Padded leading dimensions keep every row 64-byte aligned, like the workspace.
      const index_t ldk = padded_stride(std::max<index_t>(d, 1));
      const index_t ldv = padded_stride(std::max<index_t>(dv, 1));
      buf.k.reserve(static_cast<std::size_t>(kernel_config::block_k * ldk));
      buf.v.reserve(static_cast<std::size_t>(kernel_config::block_k * ldv));
      to_floats(true, b, hk, j0, bk, buf.k.data(), ldk);
      to_floats(false, b, hk, j0, bk, buf.v.data(), ldv);
      return {kv_rows_map(buf.k.data(), bk, d, Eigen::OuterStride<>(ldk)),
              kv_rows_map(buf.v.data(), bk, dv, Eigen::OuterStride<>(ldv))};
    }
  }

  /// The K (keys) or V rows [j0, j0 + n) of (b, hk) as floats into dst (leading dimension ld).
  void to_floats(bool keys, index_t b, index_t hk, index_t j0, index_t n, float* dst,
                 index_t ld) const {
    if (keys && blocked()) {
      // Block by block: element e of the block's keys is a contiguous run of 16, written
      // down a column of dst.
      const index_t d = kb.extents[3];
      for (index_t j = j0; j < j0 + n;) {
        const index_t u = j % keys_per_block, m = std::min(keys_per_block - u, j0 + n - j);
        const T* blk = kb.ptr(b, hk, j / keys_per_block);
        float* out = dst + (j - j0) * ld;
        for (index_t e = 0; e < d; ++e)
          for (index_t i = 0; i < m; ++i)
            out[i * ld + e] = static_cast<float>(blk[e * keys_per_block + u + i]);
        j += m;
      }
      return;
    }
    const tensor_view<const T, 4>& t = keys ? k : v;
    for (index_t j = 0; j < n; ++j) to_float(t.ptr(b, hk, j0 + j), dst + j * ld, t.extents[3]);
  }

  /// |k_j|^2 of key j of (b, hk), summed in float from the stored values: packets into two
  /// accumulators, then the scalar tail (compute_key_norms' margin covers any order).
  /// Widened in registers: through a converted copy of each row, with one accumulator, the
  /// pass took longer than the skipping decode step it served
  /// (docs/journal/2026-12-design-measurements.md, "kv_tiles.hpp: kv_source::key_squared_norm").
  float key_squared_norm(index_t b, index_t hk, index_t j) const {
    namespace ei = Eigen::internal;
    const T* row = k.ptr(b, hk, j);
    const index_t d = k.extents[3], dp = d / lanes * lanes;
    packet a0 = ei::pset1<packet>(0.0f), a1 = a0;
    index_t e = 0;
    for (; e + 2 * lanes <= dp; e += 2 * lanes) {
      const packet x0 = load_floats(row + e), x1 = load_floats(row + e + lanes);
      a0 = ei::pmadd(x0, x0, a0);
      a1 = ei::pmadd(x1, x1, a1);
    }
    if (e < dp) {
      const packet x0 = load_floats(row + e);
      a0 = ei::pmadd(x0, x0, a0);
    }
    float sum = ei::predux(ei::padd(a0, a1));
    for (e = dp; e < d; ++e) {
      const auto x = static_cast<float>(row[e]);
      sum += x * x;
    }
    return sum;
  }

  /// The far-tile bound on the norms of keys [j0, j1) of (b, hk) except those `excluded(j)`
  /// names (unused memory, not read): the largest |k_j|^2, rounded up (key_norm_bound); NaN
  /// when a key is NaN.
  template <class Excluded>
  float norm_bound(index_t b, index_t hk, index_t j0, index_t j1, Excluded&& excluded) const {
    float worst = 0.0f;
    if (blocked()) {
      float sq[keys_per_block];
      for (index_t j = j0; j < j1;) {
        const index_t u = j % keys_per_block, m = std::min(keys_per_block - u, j1 - j);
        block_squared_norms(b, hk, j / keys_per_block, sq);
        for (index_t i = 0; i < m; ++i)
          if (!excluded(j + i)) worst = max_keep_nan(worst, sq[u + i]);
        j += m;
      }
    } else {
      for (index_t j = j0; j < j1; ++j)
        if (!excluded(j)) worst = max_keep_nan(worst, key_squared_norm(b, hk, j));
    }
    return key_norm_bound(worst, k.extents[3]);
  }

  /// |k_j|^2 of the 16 keys of block t of (b, hk) (K in blocks) into sq: each key's lane
  /// accumulates its elements in ascending order, a packet of keys at a time.
  void block_squared_norms(index_t b, index_t hk, index_t t, float* sq) const {
    namespace ei = Eigen::internal;
    constexpr int per_block = static_cast<int>(keys_per_block / lanes);
    const T* blk = kb.ptr(b, hk, t);
    packet acc[per_block];
    for (int c = 0; c < per_block; ++c) acc[c] = ei::pset1<packet>(0.0f);
    for (index_t e = 0; e < kb.extents[3]; ++e)
      for (int c = 0; c < per_block; ++c) {
        const packet x = load_floats(blk + e * keys_per_block + c * lanes);
        acc[c] = ei::pmadd(x, x, acc[c]);
      }
    for (int c = 0; c < per_block; ++c) ei::pstoreu(sq + c * lanes, acc[c]);
  }
};

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
