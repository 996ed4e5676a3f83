// SPDX-License-Identifier: MIT
// alibi::backend::reference backward: the textbook gradients of softmax attention, with the
// scores and probabilities materialized per (batch, head) and everything accumulated in
// double. The oracle of the backward tests (checked itself against finite differences).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "alibi/attention_backward.hpp"

namespace alibi {
namespace detail {

template <>
struct attention_backward_impl<backend::reference> {
  template <class TQ, class TKV, class TO, class TG, class Isa>
  static status can_implement(const backend::reference&, const attention_problem&,
                              const attention_backward_tensors<TQ, TKV, TO, TG, Isa>&) {
    if (!std::is_floating_point<TQ>::value || !std::is_floating_point<TKV>::value ||
        !std::is_floating_point<TO>::value || !std::is_floating_point<TG>::value)
      return status::failure(
          "alibi::attention_backward (reference): q, k, v, out, dout and the gradients must be "
          "float or double");
    return {};
  }

  template <class TQ, class TKV, class TO, class TG, class Isa>
  static void run(const backend::reference&, const attention_problem& p,
                  const attention_backward_tensors<TQ, TKV, TO, TG, Isa>& t) {
    if constexpr (std::is_floating_point<TQ>::value && std::is_floating_point<TKV>::value &&
                  std::is_floating_point<TO>::value && std::is_floating_point<TG>::value)
      compute(p, t);
  }

  /// Why the reference recomputes the forward instead of using `out` and `lse`: it is the
  /// oracle of the mathematics, so its probabilities and D_i = dO_i . O_i come from the
  /// double-precision softmax of the same inputs (the fp32 forward's rounding would
  /// otherwise be part of the oracle). The fused backend uses the forward's out and lse, as
  /// every flash-attention backward does.
  template <class TQ, class TKV, class TO, class TG, class Isa>
  static void compute(const attention_problem& p,
                      const attention_backward_tensors<TQ, TKV, TO, TG, Isa>& t) {
    constexpr double neg_inf = -std::numeric_limits<double>::infinity();
    const index_t D = p.head_dim, Dv = p.v_head_dim, Lq = p.q_len, Lk = p.k_len;
    std::vector<double> prob(static_cast<std::size_t>(Lq * Lk));   // (Lq, Lk) probabilities
    std::vector<char> allowed(static_cast<std::size_t>(Lq * Lk));  // (Lq, Lk)
    std::vector<double> dk(static_cast<std::size_t>(Lk * D)), dv(static_cast<std::size_t>(Lk * Dv));
    std::vector<double> dslopes;
    if (t.dslopes.data)
      dslopes.assign(static_cast<std::size_t>(t.dslopes.extents[0] * p.q_heads), 0.0);
    for (index_t b = 0; b < p.batch; ++b) {
      const index_t lq = p.len_q(b), qo = p.q_offset(b), ko = p.k_offset(b);
      for (index_t hk = 0; hk < p.kv_heads; ++hk) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (index_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
          const float slope = p.slope(b, h);
          for (index_t i = 0; i < Lq; ++i)
            for (index_t d = 0; d < D; ++d) t.dq(b, h, i, d) = TG(0);
          // Probabilities of the allowed pairs, as the reference forward computes them.
          for (index_t i = 0; i < lq; ++i) {
            const index_range keys = p.key_range(b, i);
            const index_t shift = p.distance_shift(b, i);
            double* row = prob.data() + i * Lk;
            char* ok = allowed.data() + i * Lk;
            double m = neg_inf;
            for (index_t j = 0; j < Lk; ++j) {
              ok[j] = j >= keys.begin && j < keys.end && !p.key_excluded(b, j);
              row[j] = 0.0;
              if (!ok[j]) continue;
              double dot = 0;
              for (index_t d = 0; d < D; ++d)
                dot += static_cast<double>(t.q(b, h, i, d)) * static_cast<double>(t.k(b, hk, j, d));
              row[j] = static_cast<double>(p.scale) * dot +
                       (p.slopes.enabled ? alibi_bias_exact(slope, qo + i, ko + j, shift) : 0.0);
              if (row[j] > m || row[j] != row[j]) m = row[j];
            }
            double sum = 0;
            for (index_t j = 0; j < Lk; ++j)
              if (ok[j]) sum += (row[j] = std::exp(row[j] - m));
            for (index_t j = 0; j < Lk; ++j)
              if (ok[j]) row[j] /= sum;
          }
          for (index_t i = 0; i < lq; ++i) {
            const double* row = prob.data() + i * Lk;
            const char* ok = allowed.data() + i * Lk;
            // dP_ij = dO_i . v_j; D_i = sum_j P_ij dP_ij (= dO_i . O_i), less d loss / d lse_i
            // (d lse_i / d s_ij = P_ij).
            std::vector<double> dp(static_cast<std::size_t>(Lk), 0.0);
            std::vector<double> dq(static_cast<std::size_t>(D), 0.0);
            double delta = t.dlse.data ? -static_cast<double>(t.dlse(b, h, i)) : 0.0;
            for (index_t j = 0; j < Lk; ++j) {
              if (!ok[j]) continue;
              double x = 0;
              for (index_t d = 0; d < Dv; ++d)
                x +=
                    static_cast<double>(t.dout(b, h, i, d)) * static_cast<double>(t.v(b, hk, j, d));
              dp[static_cast<std::size_t>(j)] = x;
              delta += row[j] * x;
            }
            for (index_t j = 0; j < Lk; ++j) {
              if (!ok[j]) continue;
              // dS_ij = P_ij (dP_ij - D_i), the gradient of the score s_ij.
              const double ds = row[j] * (dp[static_cast<std::size_t>(j)] - delta);
              const double dss = static_cast<double>(p.scale) * ds;
              for (index_t d = 0; d < D; ++d) {
                dq[static_cast<std::size_t>(d)] += dss * static_cast<double>(t.k(b, hk, j, d));
                dk[static_cast<std::size_t>(j * D + d)] +=
                    dss * static_cast<double>(t.q(b, h, i, d));
              }
              for (index_t d = 0; d < Dv; ++d)
                dv[static_cast<std::size_t>(j * Dv + d)] +=
                    row[j] * static_cast<double>(t.dout(b, h, i, d));
              // s_ij = scale q.k - slope |q_pos - k_pos|: d s / d slope = -distance.
              if (t.dslopes.data) {
                const index_t qp = qo + i, kp = ko + j;
                const double dist = static_cast<double>(qp >= kp ? qp - kp : kp - qp);
                const index_t row_b = t.dslopes.extents[0] == 1 ? 0 : b;
                dslopes[static_cast<std::size_t>(row_b * p.q_heads + h)] -= ds * dist;
              }
            }
            for (index_t d = 0; d < D; ++d)
              t.dq(b, h, i, d) = static_cast<TG>(dq[static_cast<std::size_t>(d)]);
          }
        }
        for (index_t j = 0; j < Lk; ++j) {
          for (index_t d = 0; d < D; ++d)
            t.dk(b, hk, j, d) = static_cast<TG>(dk[static_cast<std::size_t>(j * D + d)]);
          for (index_t d = 0; d < Dv; ++d)
            t.dv(b, hk, j, d) = static_cast<TG>(dv[static_cast<std::size_t>(j * Dv + d)]);
        }
      }
    }
    for (index_t r = 0; r < (t.dslopes.data ? t.dslopes.extents[0] : 0); ++r)
      for (index_t h = 0; h < p.q_heads; ++h)
        t.dslopes(r, h) = static_cast<float>(dslopes[static_cast<std::size_t>(r * p.q_heads + h)]);
  }
};

}  // namespace detail
}  // namespace alibi
