// SPDX-License-Identifier: MIT
// Keys in blocks: the K layout the CPU backend's decoding reads fastest. Each block holds
// keys_per_block consecutive keys of one (batch, kv head), transposed: a row-major
// (head_dim, keys_per_block) matrix, so that element e of the block's 16 keys is one
// contiguous run. The products of a decode step then multiply a whole run by one broadcast
// query element, for every query row of a GQA group at once, instead of summing the lanes of
// one packet per (row, key).
#pragma once

#include <string>

#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {

/// Keys per block of the blocked K layout.
inline constexpr index_t keys_per_block = 16;

/// The blocks that k_len keys take (the last one may be partly used).
constexpr index_t key_block_count(index_t k_len) {
  return (k_len + keys_per_block - 1) / keys_per_block;
}

/// A (batch, kv_heads, key_block_count(k_len), head_dim, keys_per_block) view over memory in
/// that order: the blocked K of attention(backend, q, k_blocks, v, out, params). Element e of
/// key j of (b, h) is at (b, h, j / keys_per_block, e, j % keys_per_block).
template <class T>
constexpr tensor_view<T, 5> make_key_blocks(T* data, index_t batch, index_t kv_heads, index_t k_len,
                                            index_t head_dim) {
  return make_view(data, batch, kv_heads, key_block_count(k_len), head_dim, keys_per_block);
}

/// Whether a K-in-blocks view holds blocks: where a call passes K as rows, its blocked view is
/// left default-constructed (extents 0).
template <class T>
constexpr bool holds_key_blocks(const tensor_view<T, 5>& blocks) {
  return blocks.extents[4] != 0;
}

/// Writes keys into blocks: key j of k (batch, kv_heads, n, head_dim) becomes key
/// first_key + j of `blocks` (a view as make_key_blocks makes, any strides in its first
/// three dimensions), converted with static_cast (rounded to nearest for Eigen::half and
/// Eigen::bfloat16). For filling a blocked cache, or appending to one. Lanes of the blocks
/// no key is written to are left as they are (attention never uses them).
template <class T, class U>
void store_key_blocks(tensor_view<const T, 4> k, tensor_view<U, 5> blocks, index_t first_key = 0) {
  const char* f = "alibi::store_key_blocks";
  auto s = [](index_t v) { return std::to_string(v); };
  const index_t B = k.extents[0], H = k.extents[1], n = k.extents[2], D = k.extents[3];
  if (B < 0 || H < 0 || n < 0 || D < 0)
    detail::raise(argument_error(std::string(f) + ": k has a negative extent"));
  if (blocks.extents[0] != B || blocks.extents[1] != H || blocks.extents[3] != D ||
      blocks.extents[4] != keys_per_block)
    detail::raise(
        argument_error(std::string(f) +
                       ": blocks must have shape (batch, kv_heads, blocks, head_dim, 16) with "
                       "k's (batch, kv_heads, head_dim) = (" +
                       s(B) + ", " + s(H) + ", " + s(D) + "), got (" + s(blocks.extents[0]) + ", " +
                       s(blocks.extents[1]) + ", " + s(blocks.extents[2]) + ", " +
                       s(blocks.extents[3]) + ", " + s(blocks.extents[4]) + ")"));
  const index_t room = blocks.extents[2] < 0 ? 0 : blocks.extents[2] * keys_per_block;
  if (first_key < 0 || first_key > room || n > room - first_key)
    detail::raise(argument_error(std::string(f) + ": keys [first_key, first_key + n) = [" +
                                 s(first_key) + ", " + s(first_key + n) +
                                 ") must lie within the blocks' " + s(room) + " keys"));
  if (B == 0 || H == 0 || n == 0 || D == 0) return;
  if (k.data == nullptr || blocks.data == nullptr)
    detail::raise(argument_error(std::string(f) + ": k.data and blocks.data must not be null"));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t j = 0; j < n; ++j) {
        const index_t t = first_key + j;
        for (index_t e = 0; e < D; ++e)
          blocks(b, h, t / keys_per_block, e, t % keys_per_block) = static_cast<U>(k(b, h, j, e));
      }
}

}  // namespace alibi
