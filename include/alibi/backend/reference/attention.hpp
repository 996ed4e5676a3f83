// SPDX-License-Identifier: MIT
// alibi::backend::reference: the seeds' algorithm (materialize scale * Q K^T + bias with the
// masks as -inf, softmax, multiply by V), accumulated in double. The oracle for every test.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/half_types.hpp"
#include "alibi/merge.hpp"

namespace alibi {
namespace detail {

/// Input element types the reference reads: the floating-point types and Eigen's half and
/// bfloat16 (converted exactly: every value of those is a float).
template <class T>
inline constexpr bool is_reference_input =
    std::is_floating_point<T>::value || std::is_same<T, Eigen::half>::value ||
    std::is_same<T, Eigen::bfloat16>::value;

/// An input element as a double, exactly (long double rounds).
template <class T>
double input_as_double(T x) {
  if constexpr (std::is_floating_point<T>::value)
    return static_cast<double>(x);
  else
    return static_cast<double>(static_cast<float>(x));
}

template <>
struct attention_impl<backend::reference> {
  template <class TQ, class TKV, class TO>
  static constexpr bool implemented =
      is_reference_input<TQ>&& is_reference_input<TKV>&& std::is_floating_point<TO>::value;

  template <class TQ, class TKV, class TO, class Isa>
  static status can_implement(const backend::reference&, const attention_problem&,
                              const attention_tensors<TQ, TKV, TO, Isa>&) {
    if (!implemented<TQ, TKV, TO>)
      return status::failure(
          "alibi::attention (reference): q, k and v must be float, double, Eigen::half or "
          "Eigen::bfloat16 (any mix), out float or double");
    return {};
  }

  template <class TQ, class TKV, class TO, class Isa>
  static void run(const backend::reference&, const attention_problem& p,
                  const attention_tensors<TQ, TKV, TO, Isa>& t) {
    if constexpr (implemented<TQ, TKV, TO>) {
      if (!t.keys_in_blocks()) {
        compute(p, t.q, t.k, t.v, t.out);
        return;
      }
      // K in blocks: the oracle reads a row-major copy (exact, any element type).
      std::vector<TKV> rows(static_cast<std::size_t>(p.batch * p.kv_heads * p.k_len * p.head_dim));
      const auto k = make_view(rows.data(), p.batch, p.kv_heads, p.k_len, p.head_dim);
      for (index_t b = 0; b < p.batch; ++b)
        for (index_t h = 0; h < p.kv_heads; ++h)
          for (index_t j = 0; j < p.k_len; ++j)
            for (index_t e = 0; e < p.head_dim; ++e)
              k(b, h, j, e) = t.k_blocks(b, h, j / keys_per_block, e, j % keys_per_block);
      compute(p, t.q, tensor_view<const TKV, 4>(k), t.v, t.out);
    }
  }

  template <class T>
  static void merge(const backend::reference&, const partial_merge_args<T>& a) {
    for (index_t bh = 0; bh < a.out.extents[0] * a.out.extents[1]; ++bh) merge_head_rows(a, bh);
  }

  template <class TQ, class TKV, class TO>
  static void compute(const attention_problem& p, tensor_view<const TQ, 4> q,  // (B, Hq, Lq, D)
                      tensor_view<const TKV, 4> k,                             // (B, Hkv, Lk, D)
                      tensor_view<const TKV, 4> v,                             // (B, Hkv, Lk, Dv)
                      tensor_view<TO, 4> out) {                                // (B, Hq, Lq, Dv)
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    std::vector<double> scores(static_cast<std::size_t>(p.q_len * p.k_len));  // (Lq, Lk)
    std::vector<double> acc(static_cast<std::size_t>(p.v_head_dim));          // (Dv)
    for (index_t b = 0; b < p.batch; ++b) {
      const index_t lq = p.len_q(b), qo = p.q_offset(b), ko = p.k_offset(b);
      for (index_t h = 0; h < p.q_heads; ++h) {
        const index_t hk = p.kv_head(h);
        const float slope = p.slope(b, h);
        // Materialize the (masked) score matrix, as the seeds do.
        for (index_t i = 0; i < lq; ++i) {
          const index_range keys = p.key_range(b, i);
          const index_t row_shift = p.distance_shift(b, i);
          double* row = scores.data() + i * p.k_len;
          for (index_t j = 0; j < p.k_len; ++j) {
            row[j] = neg_inf;
            if (j < keys.begin || j >= keys.end || p.key_excluded(b, j)) continue;
            double dot = 0;
            for (index_t d = 0; d < p.head_dim; ++d)
              dot += input_as_double(q(b, h, i, d)) * input_as_double(k(b, hk, j, d));
            // slope 0 (or ALiBi disabled) adds nothing at all, not a signed zero. The row's
            // distance shift keeps the bias small and exact in double even for positions
            // near 2^60 (the softmax does not see it; logsumexp adds it back below).
            row[j] = static_cast<double>(p.scale) * dot +
                     (p.slopes.enabled ? alibi_bias_exact(slope, qo + i, ko + j, row_shift) : 0.0);
          }
        }
        for (index_t i = 0; i < p.q_len; ++i) {
          double* row = scores.data() + i * p.k_len;
          double m = neg_inf;
          bool any = false;
          if (i < lq)
            for (index_t j = 0; j < p.k_len; ++j) {
              // A NaN score is "not greater", so m ignores it; exp(NaN - m) below then
              // carries it into the row's sum and output (NaN propagates, E17).
              if (row[j] != neg_inf) any = true;
              if (row[j] > m) m = row[j];
            }
          std::fill(acc.begin(), acc.end(), 0.0);
          double lse = neg_inf;
          if (any) {
            // A row with finite or NaN scores: with m = -inf here only NaNs remain.
            const double shift = m == neg_inf ? 0.0 : m;
            double sum = 0;
            for (index_t j = 0; j < p.k_len; ++j) {
              if (row[j] == neg_inf) continue;
              const double w = std::exp(row[j] - shift);
              sum += w;
              for (index_t d = 0; d < p.v_head_dim; ++d)
                acc[static_cast<std::size_t>(d)] += w * input_as_double(v(b, hk, j, d));
            }
            for (auto& a : acc) a /= sum;
            lse = shift + std::log(sum) -
                  static_cast<double>(slope) * static_cast<double>(p.distance_shift(b, i));
          }
          // Fully masked rows and padded query rows: output 0 and logsumexp -inf.
          for (index_t d = 0; d < p.v_head_dim; ++d)
            out(b, h, i, d) = static_cast<TO>(acc[static_cast<std::size_t>(d)]);
          if (p.lse.data) p.lse(b, h, i) = static_cast<float>(lse);
        }
      }
    }
  }
};

}  // namespace detail
}  // namespace alibi
