// SPDX-License-Identifier: MIT
// The reference backend against a second, independent naive computation written here from
// the contract (positions, allows(), exact bias), on small shapes that cover every feature.
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "common.hpp"

namespace {

using alibi::index_t;
using alibi_test::case_data;
using alibi_test::case_spec;

// out(b,h,i,:) = sum_j w_j v_j / sum_j w_j over allowed keys, w_j = exp(s_j - max s).
double independent_max_error(case_data& c, const alibi_test::oracle_result& ref) {
  const case_spec& s = c.spec;
  const auto& p = c.params;
  double worst = 0;
  for (index_t b = 0; b < s.batch; ++b) {
    const index_t lq = p.q_lengths.data ? p.q_lengths(b) : s.lq;
    const index_t lk = p.k_lengths.data ? p.k_lengths(b) : s.lk;
    const index_t qo = p.q_offsets.data ? p.q_offsets(b) : lk - lq;
    const index_t ko = p.k_offsets.data ? p.k_offsets(b) : 0;
    for (index_t h = 0; h < s.hq; ++h) {
      const index_t hk = h / (s.hq / s.hkv);
      double slope = 0;
      if (!s.no_alibi)
        slope = s.caller_slopes
                    ? c.slopes[static_cast<std::size_t>(b * s.hq + h)]
                    : static_cast<double>(alibi::slopes(s.hq)[static_cast<std::size_t>(h)]) *
                          s.slope_scale;
      const float scale = s.scale ? *s.scale : 1.0f / std::sqrt(static_cast<float>(s.d));
      for (index_t i = 0; i < s.lq; ++i) {
        std::vector<double> sc;
        std::vector<index_t> keys;
        for (index_t j = 0; i < lq && j < lk; ++j) {
          const index_t qp = qo + i, kp = ko + j;
          if (!p.mask.allows(qp, kp)) continue;
          if (!c.key_mask.empty() && c.key_mask[static_cast<std::size_t>(b * s.lk + j)]) continue;
          double dot = 0;
          for (index_t d = 0; d < s.d; ++d)
            dot += double(c.q.view(b, h, i, d)) * double(c.k.view(b, hk, j, d));
          sc.push_back(static_cast<double>(scale) * dot - slope * std::abs(double(qp - kp)));
          keys.push_back(j);
        }
        for (index_t d = 0; d < s.v_dim(); ++d) {
          double num = 0, den = 0, mx = -std::numeric_limits<double>::infinity();
          for (double x : sc) mx = std::max(mx, x);
          for (std::size_t t = 0; t < sc.size(); ++t) {
            const double w = std::exp(sc[t] - mx);
            den += w;
            num += w * c.v.view(b, hk, keys[t], d);
          }
          const double expect = sc.empty() ? 0.0 : num / den;
          const double got =
              ref.out[static_cast<std::size_t>(((b * s.hq + h) * s.lq + i) * s.v_dim() + d)];
          worst = std::max(worst, std::abs(got - expect));
        }
      }
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("reference backend equals an independent naive computation", "[reference]") {
  std::vector<case_spec> cases;
  std::uint64_t seed = 7;
  for (index_t lq : {1, 3, 17}) {
    for (index_t lk : {1, 5, 17}) {
      for (int variant = 0; variant < 6; ++variant) {
        case_spec c;
        c.lq = lq;
        c.lk = lk;
        c.d = variant % 2 ? 8 : 5;
        c.hq = variant < 3 ? 3 : 4;
        c.hkv = variant == 4 ? 2 : variant == 5 ? 1 : c.hq;
        c.batch = 3;
        c.causal = variant % 3 == 0;
        c.window_left = variant == 2 ? 2 : -1;
        c.window_right = variant == 2 ? 1 : -1;
        c.bshd = variant % 2 == 1;
        c.lengths = variant >= 3;
        c.key_mask = variant == 1 || variant == 4;
        c.offsets = variant == 5;
        c.caller_slopes = variant == 3;
        c.scale = variant == 2 ? std::optional<float>(1.3f) : std::nullopt;
        c.seed = seed++;
        cases.push_back(c);
      }
    }
  }
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    case_data c(spec);
    const alibi_test::oracle_result ref = alibi_test::run_oracle(c);
    CHECK(independent_max_error(c, ref) < 1e-12);
  }
}
