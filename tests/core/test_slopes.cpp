// SPDX-License-Identifier: MIT
// Slopes: golden values from the paper's recursive definition evaluated independently in
// long double, tensor-parallel slices, and the known-wrong variants shown to differ.
#include <cmath>
#include <cstdint>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/core/slopes.hpp>

namespace {

// The paper's get_slopes, by repeated multiplication in long double (no exp2 anywhere).
std::vector<long double> paper_slopes_pow2(int n, long double max_bias) {
  // start = ratio = 2^(-max_bias / n), by taking n-th roots of 2^-max_bias via bisection.
  long double target = 1.0L;
  for (int i = 0; i < static_cast<int>(max_bias); ++i) target /= 2.0L;  // integer max_bias
  long double lo = 0.0L, hi = 1.0L;
  for (int it = 0; it < 200; ++it) {
    const long double mid = (lo + hi) / 2;
    long double p = 1.0L;
    for (int i = 0; i < n; ++i) p *= mid;
    (p < target ? lo : hi) = mid;
  }
  const long double ratio = (lo + hi) / 2;
  std::vector<long double> s;
  long double x = ratio;
  for (int i = 0; i < n; ++i, x *= ratio) s.push_back(x);
  return s;
}

std::vector<long double> paper_slopes(int n, long double max_bias = 8) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  if (p == n) return paper_slopes_pow2(n, max_bias);
  std::vector<long double> s = paper_slopes_pow2(p, max_bias);
  const std::vector<long double> extra = paper_slopes(2 * p, max_bias);
  for (int i = 0; static_cast<int>(s.size()) < n; i += 2)
    s.push_back(extra[static_cast<std::size_t>(i)]);
  return s;
}

}  // namespace

TEST_CASE("slopes equal the paper's recursive definition, H = 1..64", "[slopes]") {
  for (int h = 1; h <= 64; ++h) {
    const std::vector<long double> golden = paper_slopes(h);
    const std::vector<float> got = alibi::slopes(h);
    REQUIRE(got.size() == static_cast<std::size_t>(h));
    for (int i = 0; i < h; ++i) {
      INFO("H = " << h << ", head " << i);
      // Correctly rounded: the float nearest to the long double value.
      CHECK(got[static_cast<std::size_t>(i)] ==
            static_cast<float>(golden[static_cast<std::size_t>(i)]));
    }
  }
}

TEST_CASE("slopes with another max_bias follow the same definition", "[slopes]") {
  for (int mb : {4, 16}) {
    for (int h : {3, 8, 12, 40}) {
      const std::vector<long double> golden = paper_slopes(h, mb);
      const std::vector<float> got = alibi::slopes(h, static_cast<float>(mb));
      for (int i = 0; i < h; ++i) {
        INFO("max_bias " << mb << ", H " << h << ", head " << i);
        CHECK(got[static_cast<std::size_t>(i)] ==
              static_cast<float>(golden[static_cast<std::size_t>(i)]));
      }
    }
  }
}

TEST_CASE("known slope values", "[slopes]") {
  // 8 heads: 1/2, 1/4, ..., 1/256 exactly.
  const std::vector<float> s8 = alibi::slopes(8);
  for (int i = 0; i < 8; ++i) CHECK(s8[static_cast<std::size_t>(i)] == std::ldexp(1.0f, -(i + 1)));
  // 12 heads: 8 of the 8-head series, then heads 1, 3, 5, 7 of the 16-head series.
  const std::vector<float> s12 = alibi::slopes(12);
  const std::vector<float> s16 = alibi::slopes(16);
  for (int i = 0; i < 4; ++i)
    CHECK(s12[static_cast<std::size_t>(8 + i)] == s16[static_cast<std::size_t>(2 * i)]);
  CHECK(alibi::slope(0, 1) == std::ldexp(1.0f, -8));
  // The extra scale factor multiplies every slope.
  CHECK(alibi::slopes(4, 8.0f, 0.5f)[1] == 0.5f * alibi::slopes(4)[1]);
}

TEST_CASE("tensor-parallel slices are bit-identical to the slice of the full vector", "[slopes]") {
  for (int global : {6, 12, 16, 40, 64}) {
    const std::vector<float> full = alibi::slopes(global);
    for (int parts : {2, 3, 4}) {
      if (global % parts != 0) continue;
      const int count = global / parts;
      for (int r = 0; r < parts; ++r) {
        const std::vector<float> slice = alibi::slopes_slice(global, r * count, count);
        for (int i = 0; i < count; ++i)
          CHECK(slice[static_cast<std::size_t>(i)] ==
                full[static_cast<std::size_t>(r * count + i)]);
      }
      // The known bug: computing slopes from the local head count gives other values.
      const std::vector<float> local = alibi::slopes(count);
      bool differs = false;
      for (int i = 0; i < count; ++i)
        differs |= local[static_cast<std::size_t>(i)] != full[static_cast<std::size_t>(i)];
      CHECK(differs);
    }
  }
  CHECK_THROWS_WITH(alibi::slopes_slice(8, 6, 4),
                    Catch::Contains("must lie within [0, global_heads = 8)"));
}

TEST_CASE("the seeds' and other known-wrong slope formulas differ", "[slopes]") {
  for (int h : {3, 5, 6, 12, 16, 40}) {
    const std::vector<float> s = alibi::slopes(h);
    // Seed 000: 1 / 2^(i / (h - 1)).
    bool seed000_differs = false;
    for (int i = 0; i < h; ++i)
      seed000_differs |= static_cast<float>(1.0 / std::exp2(static_cast<double>(i) / (h - 1))) !=
                         s[static_cast<std::size_t>(i)];
    CHECK(seed000_differs);
    // 2^(-8 (i+1) / H) for every H: right only for powers of two.
    bool naive_differs = false;
    for (int i = 0; i < h; ++i)
      naive_differs |=
          static_cast<float>(std::exp2(-8.0 * (i + 1) / h)) != s[static_cast<std::size_t>(i)];
    CHECK(naive_differs == ((h & (h - 1)) != 0));
  }
}
