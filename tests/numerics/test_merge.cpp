// SPDX-License-Identifier: MIT
// alibi::merge_partials: attention over two disjoint key chunks, merged, equals attention over
// all keys (both host backends); empty and NaN sides; in-place merging; argument errors.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>

using alibi::index_t;

namespace {

struct problem_data {
  index_t B = 2, H = 3, Lq = 37, Lk = 300, D = 16;
  std::vector<float> q, k, v;
  explicit problem_data(unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v}) x->resize(static_cast<std::size_t>(B * H * Lk * D));
    for (auto* x : {&q, &k, &v})
      for (float& e : *x) e = nd(gen);
  }
  alibi::tensor_view<const float, 4> qv() const { return alibi::make_view(q.data(), B, H, Lq, D); }
  // Keys [k0, k0 + n) as a view of the full key tensor (positions via k_offsets).
  alibi::tensor_view<const float, 4> keys(const std::vector<float>& x, index_t k0,
                                          index_t n) const {
    return alibi::make_strided_view<const float, 4>(x.data() + k0 * D, {B, H, n, D},
                                                    {H * Lk * D, Lk * D, D, 1});
  }
};

/// Attention of all queries (positions Lk - Lq ..) over keys [k0, k0 + n) at their global
/// positions, causal.
void chunk(const problem_data& d, index_t k0, index_t n, std::vector<float>& out,
           std::vector<float>& lse) {
  out.assign(static_cast<std::size_t>(d.B * d.H * d.Lq * d.D), 0.0f);
  lse.assign(static_cast<std::size_t>(d.B * d.H * d.Lq), 0.0f);
  const std::vector<index_t> qo(static_cast<std::size_t>(d.B), d.Lk - d.Lq);
  const std::vector<index_t> ko(static_cast<std::size_t>(d.B), k0);
  alibi::attention_params p;
  p.mask.causal = true;
  p.q_offsets = alibi::make_view(qo.data(), d.B);
  p.k_offsets = alibi::make_view(ko.data(), d.B);
  p.logsumexp = alibi::make_view(lse.data(), d.B, d.H, d.Lq);
  alibi::attention(alibi::backend::eigen{2}, d.qv(), d.keys(d.k, k0, n), d.keys(d.v, k0, n),
                   alibi::make_view(out.data(), d.B, d.H, d.Lq, d.D), p);
}

}  // namespace

TEST_CASE("merging two key chunks equals attention over all keys", "[merge]") {
  const problem_data d(7);
  std::vector<float> full_o, full_l, a_o, a_l, b_o, b_l;
  chunk(d, 0, d.Lk, full_o, full_l);
  for (index_t split : {index_t(1), index_t(128), index_t(290)}) {
    chunk(d, 0, split, a_o, a_l);
    chunk(d, split, d.Lk - split, b_o, b_l);
    // Causal: the first query rows see none of the right chunk's keys (lse -inf there).
    std::vector<float> o(a_o.size()), l(a_l.size());
    const auto shape4 = [&](std::vector<float>& x) {
      return alibi::make_view(x.data(), d.B, d.H, d.Lq, d.D);
    };
    const auto shape3 = [&](std::vector<float>& x) {
      return alibi::make_view(x.data(), d.B, d.H, d.Lq);
    };
    for (int backend = 0; backend < 2; ++backend) {
      INFO("split " << split << ", backend " << backend);
      if (backend == 0)
        alibi::merge_partials(alibi::backend::eigen{2}, shape4(a_o), shape3(a_l), shape4(b_o),
                              shape3(b_l), shape4(o), shape3(l));
      else
        alibi::merge_partials(alibi::backend::reference{}, shape4(a_o), shape3(a_l), shape4(b_o),
                              shape3(b_l), shape4(o), shape3(l));
      double err = 0.0, lerr = 0.0;
      for (std::size_t i = 0; i < o.size(); ++i)
        err = std::max(err, double(std::fabs(o[i] - full_o[i])));
      for (std::size_t i = 0; i < l.size(); ++i)
        lerr = std::max(lerr, double(std::fabs(l[i] - full_l[i])));
      // Two fp32 attention results and one merge against one fp32 attention result: a few
      // ulps of the unit-scale outputs and of the logsumexps (|lse| < 16 here).
      CHECK(err < 2e-6);
      CHECK(lerr < 4e-6);
    }
  }
}

TEST_CASE("merge_partials: empty sides, NaN, in place, errors", "[merge]") {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};  // (1, 1, 2, 2)
  std::vector<float> la = {-inf, 0.0f}, lb = {-inf, std::log(3.0f)};
  auto v4 = [](std::vector<float>& x) { return alibi::make_view(x.data(), 1, 1, 2, 2); };
  auto v3 = [](std::vector<float>& x) { return alibi::make_view(x.data(), 1, 1, 2); };
  std::vector<float> o(4, -1.0f), l(2, -1.0f);
  const alibi::backend::eigen be{1};
  alibi::merge_partials(be, v4(a), v3(la), v4(b), v3(lb), v4(o), v3(l));
  // Row 0: both sides empty -> 0 and -inf. Row 1: weights 1/4 and 3/4.
  CHECK(o[0] == 0.0f);
  CHECK(o[1] == 0.0f);
  CHECK(l[0] == -inf);
  CHECK(o[2] == Approx(0.25 * 3 + 0.75 * 7).epsilon(1e-6));
  CHECK(o[3] == Approx(0.25 * 4 + 0.75 * 8).epsilon(1e-6));
  CHECK(l[1] == Approx(std::log(4.0)).epsilon(1e-6));

  // An empty side is never read, even when it holds NaN.
  std::vector<float> nan_o(4, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> l_empty = {-inf, -inf};
  alibi::merge_partials(be, v4(nan_o), v3(l_empty), v4(b), v3(lb), v4(o), v3(l));
  CHECK(o[2] == Approx(7.0f));
  CHECK(l[1] == Approx(std::log(3.0f)));
  // NaN in a used side's lse reaches the row.
  std::vector<float> l_nan = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  alibi::merge_partials(be, v4(a), v3(l_nan), v4(b), v3(lb), v4(o), v3(l));
  CHECK(std::isnan(o[2]));
  CHECK(std::isnan(l[1]));
  CHECK(o[0] == Approx(1.0f));  // row 0: only side a

  // In place: out = out_a, lse = lse_a.
  std::vector<float> a2 = a, la2 = {0.0f, 0.0f}, lb2 = {0.0f, 0.0f};
  alibi::merge_partials(be, v4(a2), v3(la2), v4(b), v3(lb2), v4(a2), v3(la2));
  CHECK(a2[0] == Approx(3.0f));
  CHECK(a2[3] == Approx(6.0f));
  CHECK(la2[0] == Approx(std::log(2.0f)));

  // Shape errors name the argument.
  auto wrong = alibi::make_view(b.data(), 1, 1, 1, 4);
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, v4(a), v3(la), wrong, v3(lb), v4(o), v3(l)),
                      Catch::Contains("out_a, out_b and out must have the same shape"));
  auto short_lse = alibi::make_view(lb.data(), 1, 1, 1);
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, v4(a), v3(la), v4(b), short_lse, v4(o), v3(l)),
                      Catch::Contains("lse_a and lse_b must have shape"));
  // Outputs written from two rows at once (rows are merged in parallel) are refused.
  const auto same_row = alibi::make_strided_view<float, 4>(o.data(), {1, 1, 2, 2}, {4, 4, 0, 1});
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, v4(a), v3(la), v4(b), v3(lb), same_row, v3(l)),
                      Catch::Contains("out"));
  const auto same_lse = alibi::make_strided_view<float, 3>(l.data(), {1, 1, 2}, {2, 2, 0});
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, v4(a), v3(la), v4(b), v3(lb), v4(o), same_lse),
                      Catch::Contains("lse"));
  // Sharing other than in place is refused: out one row off out_a (row 1 of out is row 0 of
  // out_a, read after it was written), the logsumexp over out_b's elements.
  std::vector<float> a3 = {1, 2, 3, 4, 0, 0};
  const auto shifted = alibi::make_view(a3.data() + 2, 1, 1, 2, 2);
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, alibi::make_view(a3.data(), 1, 1, 2, 2), v3(la),
                                            v4(b), v3(lb), shifted, v3(l)),
                      Catch::Contains("out and out_a share memory"));
  REQUIRE_THROWS_WITH(alibi::merge_partials(be, v4(a), v3(la), v4(b), v3(lb), v4(o),
                                            alibi::make_view(b.data() + 1, 1, 1, 2)),
                      Catch::Contains("lse and out_b share memory"));
}

TEST_CASE("merge_partials: logsumexps beyond 2.4e38 in magnitude", "[merge]") {
  // lse x log2(e) overflows fp32 there; the merge must still weigh the sides by exp(lse_a -
  // lse_b). Rows: equal huge lse; huge against its negation; a huge negative lse alone;
  // two huge lse one ulp (2^104) apart, where the smaller side's weight underflows to 0.
  constexpr float inf = std::numeric_limits<float>::infinity();
  constexpr float big = 3.0e38f;
  const float near = std::nextafter(big, 0.0f);
  const double gap = static_cast<double>(big) - static_cast<double>(near);
  std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = {9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<float> la = {big, big, -big, big}, lb = {big, -big, -inf, near};
  const double w = 1.0 / (1.0 + std::exp(-gap));  // weight of side a in the last row
  auto v4 = [](std::vector<float>& x) { return alibi::make_view(x.data(), 1, 1, 4, 2); };
  auto v3 = [](std::vector<float>& x) { return alibi::make_view(x.data(), 1, 1, 4); };
  auto check = [&](const auto& be) {
    std::vector<float> o(8, -1.0f), l(4, -1.0f);
    alibi::merge_partials(be, v4(a), v3(la), v4(b), v3(lb), v4(o), v3(l));
    CHECK(o[0] == Approx(5.0f).epsilon(1e-6));
    CHECK(o[1] == Approx(6.0f).epsilon(1e-6));
    CHECK(l[0] == Approx(static_cast<double>(big) + std::log(2.0)).epsilon(1e-6));
    CHECK(o[2] == 3.0f);
    CHECK(o[3] == 4.0f);
    CHECK(l[1] == big);
    CHECK(o[4] == 5.0f);
    CHECK(o[5] == 6.0f);
    CHECK(l[2] == -big);
    CHECK(o[6] == Approx(w * 7 + (1 - w) * 15).epsilon(1e-6));
    CHECK(o[7] == Approx(w * 8 + (1 - w) * 16).epsilon(1e-6));
    CHECK(std::isfinite(l[3]));
    CHECK(l[3] >= big);
  };
  check(alibi::backend::eigen{1});
  check(alibi::backend::reference{});
}
