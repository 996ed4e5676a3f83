// SPDX-License-Identifier: MIT
// The key-norm pass of far-tile skipping: upper bounds on the norms of the keys of each
// (batch, kv head), as prefix and suffix maxima over the key tiles, for the forward and the
// backward kernels.
#pragma once

#include <algorithm>

#include "alibi/backend/eigen/kv_tiles.hpp"
#include "alibi/backend/host/parallel.hpp"
#include "alibi/core/problem.hpp"
#include "alibi/numerics/far_tiles.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// Upper bounds on key norms for the far-tile bound: for one (batch, kv head), over the key
/// grid tiles [t * block_k, (t + 1) * block_k), prefix[t] = max |k_j| for j < (t + 1) *
/// block_k and suffix[t] = max |k_j| for j >= t * block_k. Null when skipping is off.
struct key_norms {
  const float* prefix = nullptr;
  const float* suffix = nullptr;
};
/// Key-norm bounds for far-tile skipping: one pass over K (B * Hkv * Lk * D), small next to
/// a prefill's attention; a decode step reads K once more for it, so there skipping pays
/// once it skips more than about half of the tiles (it skips most at long lengths). Keys
/// past the length or excluded by the key mask are unused memory and are not read.
/// prefix and suffix: (B, Hkv, grid) each.
static_assert(kernel_config::block_k == key_norm_block,
              "caller key-norm bounds are per key tile of the kernel");
template <class T>
void compute_key_norms(int threads, const attention_problem& p, const kv_source<T>& kv,
                       index_t grid, float* prefix, float* suffix) {
  constexpr index_t bk = kernel_config::block_k;
  // Only keys some row can reach: the rows' key ranges are monotone, so their union is
  // [range of row 0).begin, (range of the last row).end).
  auto reachable = [&](index_t b) {
    const index_t lq = p.len_q(b);
    return index_range{lq > 0 ? p.key_range(b, 0).begin : 0,
                       lq > 0 ? p.key_range(b, lq - 1).end : 0};
  };
  auto excluded = [&](index_t b) { return [&p, b](index_t j) { return p.key_excluded(b, j); }; };
  // K with the tokens outermost: a key tile at a time for every KV head, each token's rows
  // of all heads one after the other, so that the pass reads K in ascending addresses. One
  // KV head at a time, it read a few lines of every token's row, and a decode step with
  // skipping on took several times as long as with the heads outermost, longer than without
  // skipping (docs/journal/2026-12-design-measurements.md,
  // "key_norm_pass.hpp: compute_key_norms"). The same norms, so the same bounds (a maximum
  // does not depend on the order; NaN stays NaN).
  const bool by_tokens = !p.key_norm_bounds.data && kv.keys_interleave();
  if (by_tokens)
    parallel_for(threads, p.batch * grid, [&](index_t bt) {
      const index_t b = bt / grid, t = bt % grid;
      const index_range reach = reachable(b);
      thread_local std::vector<float> worst;
      worst.assign(static_cast<std::size_t>(p.kv_heads), 0.0f);
      const auto is_excluded = excluded(b);
      for (index_t j = std::max(reach.begin, t * bk); j < std::min(reach.end, (t + 1) * bk); ++j)
        if (!is_excluded(j))
          for (index_t hk = 0; hk < p.kv_heads; ++hk)
            worst.data()[hk] = max_keep_nan(worst.data()[hk], kv.key_squared_norm(b, hk, j));
      for (index_t hk = 0; hk < p.kv_heads; ++hk)
        prefix[(b * p.kv_heads + hk) * grid + t] =
            key_norm_bound(worst.data()[hk], kv.k.extents[3]);
    });
  parallel_for(threads, p.batch * p.kv_heads, [&](index_t bh) {
    const index_t b = bh / p.kv_heads, hk = bh % p.kv_heads;
    float* pre = prefix + bh * grid;
    float* suf = suffix + bh * grid;
    const index_range reach = reachable(b);
    if (p.key_norm_bounds.data) {  // the caller's bounds
      for (index_t t = 0; t < grid; ++t) pre[t] = suf[t] = p.key_norm_bounds(b, hk, t);
    } else if (by_tokens) {
      std::copy(pre, pre + grid, suf);
    } else {
      for (index_t t = 0; t < grid; ++t)  // NaN disables skipping
        pre[t] = suf[t] = kv.norm_bound(b, hk, std::max(reach.begin, t * bk),
                                        std::min(reach.end, (t + 1) * bk), excluded(b));
    }
    for (index_t t = 1; t < grid; ++t) pre[t] = max_keep_nan(pre[t - 1], pre[t]);
    for (index_t t = grid - 2; t >= 0; --t) suf[t] = max_keep_nan(suf[t + 1], suf[t]);
  });
}
}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
