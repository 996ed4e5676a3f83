// SPDX-License-Identifier: MIT
// K/V of many sequences for ragged attention (alibi/ragged_attention.hpp): in pages, as
// FlashAttention's flash_attn_with_kvcache and vLLM keep them, or one contiguous slot per
// sequence as alibi::kv_cache does. Views only (no third-party header, trivially copyable),
// so that a device backend takes the same types with device pointers; the page size is a
// runtime value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "alibi/core/config.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// Pages of K and V. Element type T: float, Eigen::half, Eigen::bfloat16, or std::int8_t
/// with one float scale per (token, kv head) for K and for V (a stored value x_q stands for
/// x_q * scale). Sequence s holds context_len(s) tokens; its token j lives in page
/// block_table(s, j / page_size), slot j % page_size. Page slots past a sequence's length,
/// table entries past its last page and pages no table names are never read.
template <class T>
struct paged_kv {
  tensor_view<const T, 4> k{};  // (num_pages, page_size, kv_heads, head_dim)
  tensor_view<const T, 4> v{};  // (num_pages, page_size, kv_heads, v_head_dim)
  /// int8 only: (num_pages, page_size, kv_heads) scales of K and of V.
  tensor_view<const float, 3> k_scales{}, v_scales{};
  tensor_view<const std::int32_t, 2> block_table{};  // (num_seqs, max_pages_per_seq) page ids
  /// (num_seqs) tokens per sequence: one of the two, int64 or int32.
  tensor_view<const std::int64_t, 1> context_lens{};
  tensor_view<const std::int32_t, 1> context_lens32{};
  /// Optional, for far-page skipping: (num_pages, kv_heads) upper bounds on the Euclidean norm
  /// of the keys each page holds (as the attention reads them: dequantized for int8). Without
  /// them every page a row can see is read. paged_kv_cache keeps them as it appends.
  tensor_view<const float, 2> page_key_norms{};

  ALIBI_HOST_DEVICE index_t page_size() const { return k.extents[1]; }
  ALIBI_HOST_DEVICE index_t num_seqs() const { return block_table.extents[0]; }
  ALIBI_HOST_DEVICE index_t context_len(index_t s) const {
    return context_lens.data ? static_cast<index_t>(context_lens(s))
                             : static_cast<index_t>(context_lens32(s));
  }
};

/// One contiguous slot per sequence, alibi::kv_cache's layout: K (num_seqs, kv_heads,
/// max_len, head_dim), V likewise, the first context_len(s) tokens of slot s in use.
/// int8 K/V take scales (num_seqs, kv_heads, max_len). The same ragged attention reads this
/// and paged_kv, with bitwise the same results for the same tokens.
template <class T>
struct contiguous_kv {
  tensor_view<const T, 4> k{};                         // (num_seqs, kv_heads, max_len, head_dim)
  tensor_view<const T, 4> v{};                         // (num_seqs, kv_heads, max_len, v_head_dim)
  tensor_view<const float, 3> k_scales{}, v_scales{};  // int8 only: (num_seqs, kv_heads, max_len)
  tensor_view<const std::int64_t, 1> context_lens{};
  tensor_view<const std::int32_t, 1> context_lens32{};

  ALIBI_HOST_DEVICE index_t num_seqs() const { return k.extents[0]; }
  ALIBI_HOST_DEVICE index_t context_len(index_t s) const {
    return context_lens.data ? static_cast<index_t>(context_lens(s))
                             : static_cast<index_t>(context_lens32(s));
  }
};

/// A ragged batch of a layer's forward over a paged cache: sequence i of the batch owns the
/// packed rows [cu_seqlens(i), cu_seqlens(i + 1)) of the layer's input and is slot seqs(i)
/// of the cache (host memory; int64).
struct ragged_batch {
  tensor_view<const index_t, 1> cu_seqlens{};  // (n + 1)
  tensor_view<const index_t, 1> seqs{};        // (n)
};

/// Whether T is the 8-bit K/V type (values with scales).
template <class T>
inline constexpr bool is_int8_kv = std::is_same<T, std::int8_t>::value;

static_assert(std::is_trivially_copyable<paged_kv<float>>::value,
              "paged_kv must stay trivially copyable (a kernel argument)");
static_assert(std::is_trivially_copyable<contiguous_kv<float>>::value,
              "contiguous_kv must stay trivially copyable (a kernel argument)");

}  // namespace alibi
