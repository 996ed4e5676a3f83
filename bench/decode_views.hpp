// SPDX-License-Identifier: MIT
// The K/V views of the decode benchmarks (bench_decode.cpp and the in-process A/B tool,
// ab/decode_step.cpp): one sequence's K and V, (1, Hkv, Lk, D), and the same K in blocks of
// 16 keys (alibi/core/key_blocks.hpp), either streamed from memory or with a key stride of 0; or K and V
// read with the tokens outermost.
#pragma once

#include <alibi/core/key_blocks.hpp>
#include <alibi/core/tensor_view.hpp>

namespace alibi_bench {

/// K as rows, V, and K in blocks of one decode step.
template <class T>
struct decode_views {
  alibi::tensor_view<const T, 4> k, v;
  alibi::tensor_view<const T, 5> kb;
};

/// Views of one sequence's K and V (Hkv heads, Lk keys, head dim d) and of K in blocks.
/// streamed: k and v hold (Hkv, Lk, d) and kb holds (Hkv, ceil(Lk / 16), d, 16), all dense.
/// Otherwise every key of a KV head reads the same row (k, v: (Hkv, d); kb: (Hkv, d, 16), one
/// block per KV head) through a key (block) stride of 0: the step runs all its products,
/// softmax and bookkeeping with every byte in L1, the arithmetic without the memory traffic.
template <class T>
decode_views<T> make_decode_views(const T* k, const T* kb, const T* v, alibi::index_t hkv,
                                  alibi::index_t lk, alibi::index_t d, bool streamed) {
  const alibi::index_t row = streamed ? d : 0, head = streamed ? lk * d : d;
  const alibi::index_t block = d * alibi::keys_per_block, nb = alibi::key_block_count(lk);
  decode_views<T> views;
  views.k = alibi::make_strided_view<const T, 4>(k, {1, hkv, lk, d}, {hkv * head, head, row, 1});
  views.v = alibi::make_strided_view<const T, 4>(v, {1, hkv, lk, d}, {hkv * head, head, row, 1});
  const alibi::index_t block_stride = streamed ? block : 0,
                       block_head = streamed ? nb * block : block;
  views.kb = alibi::make_strided_view<const T, 5>(
      kb, {1, hkv, nb, d, alibi::keys_per_block},
      {hkv * block_head, block_head, block_stride, alibi::keys_per_block, 1});
  return views;
}

/// The k and v of streamed views read with the tokens outermost instead: the same buffers as
/// (1, lk, hkv, d) memory, each head's rows hkv * d elements apart (the time of a step does
/// not depend on the values).
template <class T>
void read_tokens_outer(decode_views<T>& views, const T* k, const T* v, alibi::index_t hkv,
                       alibi::index_t lk, alibi::index_t d) {
  views.k = alibi::make_strided_view<const T, 4>(k, {1, hkv, lk, d}, {lk * hkv * d, d, hkv * d, 1});
  views.v = alibi::make_strided_view<const T, 4>(v, {1, hkv, lk, d}, {lk * hkv * d, d, hkv * d, 1});
}

}  // namespace alibi_bench
