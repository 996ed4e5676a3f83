// SPDX-License-Identifier: MIT
// One decode call (one query token, 32 query heads, D 128, far-tile skipping off) through
// alibi::attention, compiled once per version of alibi's headers by bench/scripts/decode-ab.sh:
// ALIBI_AB_STEP names this version's function, and the script gives each version's CPU code
// its own inline namespace so that both live in one program.
#include <alibi/alibi.hpp>

#include "../decode_views.hpp"

namespace {

using alibi::index_t;

template <class T>
void call(int threads, const float* q, const T* k, const T* kb, const T* v, float* out, index_t hkv,
          index_t lk, bool streamed, int layout) {
  const index_t hq = 32, d = 128;
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = false;
  const alibi::backend::eigen be{threads};
  const auto qv = alibi::make_view<const float>(q, 1, hq, 1, d);
  const auto ov = alibi::make_view(out, 1, hq, 1, d);
  // Not streamed: a key stride of 0, every key reads the same L1-resident row (the
  // arithmetic alone).
  alibi_bench::decode_views<T> kv = alibi_bench::make_decode_views(k, kb, v, hkv, lk, d, streamed);
  if (layout == 2 && streamed) alibi_bench::read_tokens_outer(kv, k, v, hkv, lk, d);
  if (layout == 1)
    alibi::attention(be, qv, kv.kb, kv.v, ov, p);
  else
    alibi::attention(be, qv, kv.k, kv.v, ov, p);
}

}  // namespace

/// type 0 fp32, 1 fp16, 2 bf16 K/V (k: K as rows, kb: K in blocks; the timing does not
/// depend on their values); layout 0: K as rows, heads outermost; 1: K in blocks; 2: K and
/// V with the tokens outermost ((1, lk, hkv, d) memory; not streamed, as layout 0: with a
/// key stride of 0 the heads do not interleave, so the arithmetic alone is layout 0's plan).
void ALIBI_AB_STEP(int type, int threads, const float* q, const void* k, const void* kb,
                   const void* v, float* out, index_t hkv, index_t lk, bool streamed, int layout) {
  if (type == 1)
    call(threads, q, static_cast<const Eigen::half*>(k), static_cast<const Eigen::half*>(kb),
         static_cast<const Eigen::half*>(v), out, hkv, lk, streamed, layout);
  else if (type == 2)
    call(threads, q, static_cast<const Eigen::bfloat16*>(k),
         static_cast<const Eigen::bfloat16*>(kb), static_cast<const Eigen::bfloat16*>(v), out, hkv,
         lk, streamed, layout);
  else
    call(threads, q, static_cast<const float*>(k), static_cast<const float*>(kb),
         static_cast<const float*>(v), out, hkv, lk, streamed, layout);
}
