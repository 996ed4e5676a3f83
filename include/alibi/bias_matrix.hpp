// SPDX-License-Identifier: MIT
// Materialized ALiBi bias matrices, for inspection, for frameworks that add a bias tensor
// themselves, and for tests. The fused backends never build one.
#pragma once

#include <limits>

#include "alibi/attention.hpp"

namespace alibi {

/// Fills out (batch, heads, q_len, k_len) with the additive bias the attention applies:
/// -slope(b, h) * |q_pos - k_pos| in fp32 for allowed keys, -inf for keys excluded by the
/// causal/window masks, the key lengths or the key mask, and -inf on padded query rows.
/// The distances are absolute, so beyond 2^24 neighbouring keys share one fp32 bias; the
/// fused backends measure them from each row's nearest allowed key (a softmax-invariant
/// shift) and still tell such keys apart. `out` must not overlap itself or the parameters.
/// Slopes, masks, lengths and positions come from `params` exactly as attention() reads
/// them (params.scale and params.logsumexp are ignored). With ALiBi disabled the allowed
/// entries are 0.
inline void fill_bias(tensor_view<float, 4> out, const attention_params& params = {}) {
  const index_t B = out.extents[0], H = out.extents[1], Lq = out.extents[2], Lk = out.extents[3];
  // Zero-width q/k/v views carry the sizes through the one argument check.
  const auto q = make_view<const float>(nullptr, B, H, Lq, 0);
  const auto k = make_view<const float>(nullptr, B, H, Lk, 0);
  const auto o = make_view<float>(nullptr, B, H, Lq, 0);
  attention_params p = params;
  p.logsumexp = {};
  p.scale = 1.0f;
  detail::attention_problem prob;
  const char* fn = "alibi::fill_bias";
  detail::check_view(fn, "out", out).throw_if_failed();
  detail::make_problem(q, k, k, o, p, true, prob, fn).throw_if_failed();
  // out is written while the parameters are read (a slope under out changed as it was
  // written), and each of its elements once.
  detail::check_no_overlap(fn, "out", out).throw_if_failed();
  detail::check_disjoint_from(fn, "out", out, "params.slopes.values", p.slopes.values,
                              "params.key_mask", p.key_mask, "params.q_lengths", p.q_lengths,
                              "params.k_lengths", p.k_lengths, "params.q_offsets", p.q_offsets,
                              "params.k_offsets", p.k_offsets)
      .throw_if_failed();
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  for (index_t b = 0; b < B; ++b) {
    const index_t lq = prob.len_q(b), qo = prob.q_offset(b), ko = prob.k_offset(b);
    for (index_t h = 0; h < H; ++h) {
      const float slope = prob.slope(b, h);
      for (index_t i = 0; i < Lq; ++i) {
        const index_range keys = i < lq ? prob.key_range(b, i) : index_range{};
        for (index_t j = 0; j < Lk; ++j) {
          const bool allowed = j >= keys.begin && j < keys.end && !prob.key_excluded(b, j);
          out(b, h, i, j) = !allowed              ? neg_inf
                            : prob.slopes.enabled ? alibi_bias(slope, qo + i, ko + j)
                                                  : 0.0f;
        }
      }
    }
  }
}

}  // namespace alibi
