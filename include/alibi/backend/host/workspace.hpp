// SPDX-License-Identifier: MIT
// Memory of the fused CPU kernel: alibi's own aligned buffers and the per-thread workspace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <new>
#include <utility>

#include "alibi/core/config.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace cpu {

/// Tile sizes and work-splitting constants of the fused CPU kernel.
struct kernel_config {
  static constexpr index_t block_q = 512;  // query rows per work item
  static constexpr index_t block_k = 128;  // keys per inner tile
  // Few (batch, head, query tile) items (decoding: q_len 1..16) leave threads idle, so the
  // keys are then split into chunks whose partial results are merged through their
  // softmax states. The split depends on the shape (and, for KV heads that interleave in
  // memory, on the K/V strides: work_plan) only, never on the thread count, so results stay
  // bitwise independent of the thread count.
  static constexpr index_t min_items = 16;
  // Calls with at most this many query rows (decoding, a few speculative tokens) work on
  // the query heads of a GQA group together, so that they share each K/V tile; work items
  // with at most this many valid rows go through the small-row products (small_rows.hpp).
  static constexpr index_t small_rows = 16;
  static constexpr index_t min_split_keys = 2048;
  // Small calls over interleaved KV heads (work_plan) take key chunks spanning about this
  // many bytes of each of K and V, of about min_interleaved_keys to min_split_keys keys (at
  // least two tiles, so that a chunk's next tile is requested while its first is computed;
  // k_len is divided evenly, then the chunk rounded up to whole tiles), or longer where
  // max_partial_bytes caps the number of chunks.
  static constexpr index_t interleaved_chunk_bytes = index_t(4) << 20;
  static constexpr index_t min_interleaved_keys = 2 * block_k;
  static_assert(min_interleaved_keys <= min_split_keys && min_interleaved_keys % block_k == 0,
                "interleaved key chunks: whole tiles, at most min_split_keys");
  static_assert(min_split_keys % block_k == 0, "key chunks must hold whole key tiles");
  // Small calls whose K and V rows of all KV heads of a key make one run of memory (the
  // tokens outermost: work_plan::all_kv_heads) go through each key tile in blocks spanning
  // about this many bytes of K (or V) of all heads, clamped to 16 to 32 keys: a block is
  // read while the one before is computed, and stays in L2 until every head has used it.
  static constexpr index_t kv_heads_block_bytes = index_t(256) << 10;
  static constexpr index_t min_kv_heads_block_keys = 16, max_kv_heads_block_keys = 32;
  static_assert(max_kv_heads_block_keys <= block_k, "blocks of keys within one key tile");
  // Their key chunks (while a call has fewer than min_items batch entries) hold at least
  // this many keys: one or two sequences of 4096 keys take 8 chunks each, work for more
  // cores than two, at some cost on fewer (docs/journal/2026-12-design-measurements.md,
  // "host/workspace.hpp: kernel_config::min_kv_heads_chunk_keys").
  static constexpr index_t min_kv_heads_chunk_keys = 4 * block_k;
  // The partial results of a split call (each chunk's output rows and softmax states) stay
  // within this many bytes, whatever the batch: fewer, longer chunks rather than memory
  // that grows with batch x heads x query rows x chunks (and stays reserved in the calling
  // thread). Large enough that decoding (one query row per head) with 32 heads keeps its
  // chunks while sequences x keys stay within about 4M (about 126 sequences of 32768 keys); beyond
  // that, and with several query rows per head, interleaved heads' chunks grow past
  // interleaved_chunk_bytes (no such call was among the benchmarks that chose them).
  static constexpr index_t max_partial_bytes = index_t(256) << 20;
};

/// The key chunks of a call with few units of work (fewer than min_items: decoding a few
/// sequences, or a prefill of few heads): about min_items / units chunks, so that every
/// thread has work, of at least min_keys keys each; 1 from min_items units on. Shape only,
/// never the thread count, so that results stay bitwise independent of it.
inline index_t few_units_splits(index_t units, index_t min_items, index_t k_len, index_t min_keys) {
  if (units <= 0 || units >= min_items) return 1;
  return std::max<index_t>(1, std::min((min_items + units - 1) / units, k_len / min_keys));
}

/// A growable array of trivially copyable T, 64-byte aligned, allocated by alibi itself.
/// Why not Eigen::aligned_allocator: Eigen's aligned allocation differs with the compiler's
/// target flags (16- or 64-byte alignment, malloc or a hand-made offset) behind one weak
/// inline symbol, so in a program whose translation units were built with different -march
/// flags memory allocated by one could be freed by the other's deallocator. This buffer
/// behaves the same whatever the flags. Growing discards the contents.
template <class T>
class aligned_buffer {
 public:
  static constexpr std::size_t alignment = 64;
  aligned_buffer() = default;
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
  aligned_buffer(aligned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~aligned_buffer() { release(); }

  /// At least n elements; new storage is filled with `fill`.
  void reserve(std::size_t n, T fill = T{}) {
    if (n <= size_) return;
    T* fresh = static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{alignment}));
    release();
    data_ = fresh;
    size_ = n;
    std::fill(data_, data_ + n, fill);
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  T& operator[](index_t i) { return data_[i]; }
  const T& operator[](index_t i) const { return data_[i]; }

 private:
  void release() {
    if (data_) ::operator delete (data_, std::align_val_t{alignment});
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A standard allocator of 64-byte aligned memory, by the same operator new as
/// aligned_buffer: the storage of the CPU layers' buffers (the kv_cache, activations,
/// weights). Why: a 64-byte packet load from a row that is not 64-byte aligned spans two
/// cache lines, and large blocks from malloc are 16 bytes past a page boundary. Decode steps
/// over aligned K/V were faster with fp16 MHA, and with fp32 when far-tile skipping keeps
/// much of the work in cache (docs/journal/2026-12-design-measurements.md,
/// "host/workspace.hpp: aligned_allocator").
template <class T>
struct aligned_allocator {
  using value_type = T;
  aligned_allocator() = default;
  template <class U>
  aligned_allocator(const aligned_allocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(
        ::operator new (n * sizeof(T), std::align_val_t{aligned_buffer<T>::alignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{aligned_buffer<T>::alignment});
  }
  template <class U>
  bool operator==(const aligned_allocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const aligned_allocator<U>&) const noexcept {
    return false;
  }
};

/// Leading dimensions of the scratch matrices, in floats: a multiple of 16 (64 bytes).
inline index_t padded_stride(index_t n) { return (n + 15) / 16 * 16; }

/// Per-thread scratch, grown on demand and reused across calls. Why aligned, with padded
/// leading dimensions: Eigen picks its packet peeling from pointer alignment, which would
/// change the summation order, and so the last bits, from one thread's buffers to another's;
/// with every buffer 64-byte aligned every thread computes in the same order.
struct workspace {
  static constexpr index_t rows = kernel_config::block_q + 16;  // room for packet padding
  /// Query rows this workspace holds: `rows`, or fewer for the small items of decoding,
  /// where each query head of a GQA group has a workspace of its own.
  index_t capacity = rows;
  aligned_buffer<float> s;  // (capacity, block_k) column-major: scores, then probabilities
  aligned_buffer<float> o;  // (capacity, Dv) column-major: unnormalized output
  aligned_buffer<float> v;  // (block_k, padded Dv) a V tile with unusable rows zeroed
  aligned_buffer<float> q;  // (capacity, D) column-major: the item's query rows (q_cols)
  // Per query row of the item (capacity):
  aligned_buffer<float> base, shift_f, mx, m_use, alpha, lsum, qnorm;
  aligned_buffer<softmax_state> state;
  aligned_buffer<index_t> shift, begin, end;
  // Per key of the tile (block_k): valid local rows [c0, c1).
  aligned_buffer<index_t> c0, c1;
  aligned_buffer<index_t> bad;  // keys of the tile whose V row stays out of the GEMM
  index_t bad_count = 0;

  explicit workspace(index_t capacity_rows = rows) : capacity(capacity_rows) {}

  /// The leading dimension of the column-major s and o.
  index_t ld() const { return padded_stride(capacity); }

  void reserve(index_t dv) {
    const auto r = static_cast<std::size_t>(capacity);
    const auto bk = static_cast<std::size_t>(kernel_config::block_k);
    // At least one padded row even for v_head_dim 0, so that no map is built on null.
    const auto d = static_cast<std::size_t>(padded_stride(std::max<index_t>(dv, 1)));
    s.reserve(r * bk);
    o.reserve(r * d);
    for (auto* a : {&base, &shift_f, &mx, &m_use, &alpha, &lsum, &qnorm}) a->reserve(r);
    state.reserve(r);
    for (auto* a : {&shift, &begin, &end}) a->reserve(r);
    for (auto* a : {&c0, &c1, &bad}) a->reserve(bk);
  }

  /// The item's query rows packed as columns (pack_columns: (ld(), D) column-major),
  /// allocated on first use.
  float* q_cols(index_t d) {
    q.reserve(static_cast<std::size_t>(ld() * std::max<index_t>(d, 1)));
    return q.data();
  }

  /// The V-tile scratch (block_k, padded Dv), allocated on first use: only tiles with keys
  /// that must stay out of a P V product need it.
  float* tile_v(index_t dv) {
    v.reserve(
        static_cast<std::size_t>(kernel_config::block_k * padded_stride(std::max<index_t>(dv, 1))));
    return v.data();
  }
};

}  // namespace cpu
}  // namespace detail
}  // namespace alibi
