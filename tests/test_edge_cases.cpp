// SPDX-License-Identifier: MIT
// The rows of the edge-case checklist that can be stated as properties, on every CPU
// backend (the reference included): each SECTION names its row.
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "backends.hpp"
#include "common.hpp"

using alibi::index_t;
using alibi_test::case_data;
using alibi_test::case_spec;
using alibi_test::padded_tensor;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();

template <class Backend>
struct run_result {
  std::vector<float> out;  // (batch, hq, lq, dv) dense
  std::vector<float> lse;
};

template <class B>
run_result<B> run(case_data& c) {
  const case_spec& s = c.spec;
  padded_tensor<float> out(s.batch, s.hq, s.lq, s.v_dim(), s.bshd, -77.0f);
  run_result<B> r;
  r.lse.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq), 5.0f);
  alibi::attention_params p = c.params;
  p.logsumexp = alibi::make_view(r.lse.data(), s.batch, s.hq, s.lq);
  alibi::attention(B::make(), c.q.view, c.k.view, c.v.view, out.view, p);
  REQUIRE(out.touched_outside() == 0);
  out.for_each([&](float x, index_t, index_t, index_t, index_t) { r.out.push_back(x); });
  return r;
}
}  // namespace

TEMPLATE_TEST_CASE("edge cases", "[edge]", alibi_test::reference_backend, alibi_test::eigen_1thread,
                   alibi_test::eigen_2threads) {
  using B = TestType;
  SECTION("E1: empty batch, heads or queries launch nothing and write nothing") {
    for (auto [b, h, lq] : {std::tuple<index_t, index_t, index_t>{0, 2, 4}, {2, 0, 4}, {2, 2, 0}}) {
      // q and out hold no element; k and v do.
      std::vector<float> kv(static_cast<std::size_t>(b * (h == 0 ? 1 : h) * 5 * 16), 1.0f);
      const auto q = alibi::make_view<const float>(nullptr, b, h, lq, 16);
      const auto k = alibi::make_view<const float>(kv.data(), b, h == 0 ? 1 : h, 5, 16);
      auto out = alibi::make_view<float>(nullptr, b, h, lq, 16);
      CHECK_NOTHROW(alibi::attention(B::make(), q, k, k, out));
    }
  }
  SECTION("E2: no keys (k_len 0, or a sequence whose keys are all padding) gives 0 and lse -inf") {
    case_spec s;
    s.lq = 5;
    s.lk = 0;
    s.d = 8;
    case_data c(s);
    const auto r = run<B>(c);
    for (float x : r.out) CHECK(x == 0.0f);
    for (float x : r.lse) CHECK(x == -inf);
  }
  SECTION("E5: causal with q_len > k_len masks the first rows completely") {
    case_spec s;
    s.lq = 9;
    s.lk = 4;
    s.d = 16;
    s.causal = true;
    case_data c(s);
    const auto r = run<B>(c);
    for (index_t i = 0; i < 9; ++i) {
      INFO("row " << i);
      const bool masked = i < 5;  // query positions -5..-1 see no key
      CHECK((r.lse[static_cast<std::size_t>(i)] == -inf) == masked);
      for (index_t d = 0; d < 16; ++d) {
        const float x = r.out[static_cast<std::size_t>(i * 16 + d)];
        CHECK(!std::isnan(x));
        if (masked) CHECK(x == 0.0f);
      }
    }
  }
  SECTION("E6: every key masked by the key mask gives 0, not NaN or mean(V)") {
    case_spec s;
    s.batch = 2;
    s.lq = 3;
    s.lk = 6;
    s.d = 8;
    s.key_mask = true;  // the last batch entry is masked completely
    case_data c(s);
    const auto r = run<B>(c);
    for (index_t e = 3 * 8; e < 6 * 8; ++e) CHECK(r.out[static_cast<std::size_t>(e)] == 0.0f);
    for (index_t i = 3; i < 6; ++i) CHECK(r.lse[static_cast<std::size_t>(i)] == -inf);
  }
  SECTION("E7: a row with a single allowed key returns exactly that key's value row") {
    case_spec s;
    s.lq = 4;
    s.lk = 4;
    s.d = 8;
    s.causal = true;
    s.window_left = 0;  // each query sees only the key at its own position
    case_data c(s);
    const auto r = run<B>(c);
    for (index_t i = 0; i < 4; ++i)
      for (index_t d = 0; d < 8; ++d)
        CHECK(r.out[static_cast<std::size_t>(i * 8 + d)] == c.v.view(0, 0, i, d));
  }
  SECTION("E12: slope 0 equals attention without ALiBi bitwise; large slopes stay finite") {
    case_spec s;
    s.lq = 70;
    s.lk = 300;
    s.hq = 2;
    s.hkv = 2;
    s.d = 32;
    s.no_alibi = true;
    case_data plain(s);
    const auto r0 = run<B>(plain);
    std::vector<float> zeros(2, 0.0f);
    plain.params.slopes = alibi::slope_config::per_head(zeros.data(), 2);
    const auto r1 = run<B>(plain);
    CHECK(r0.out == r1.out);
    CHECK(r0.lse == r1.lse);
    s.no_alibi = false;
    s.slope_scale = 64.0f;  // slopes up to 32: bias -32 * 300 per row
    case_data steep(s);
    const auto r2 = run<B>(steep);
    for (float x : r2.out) CHECK(std::isfinite(x));
    for (float x : r2.lse) CHECK(std::isfinite(x));
  }
  SECTION("E12: negative slopes are allowed and favour far keys") {
    case_spec s;
    s.lq = 3;
    s.lk = 40;
    s.d = 4;
    s.slope_scale = -1.0f;
    case_data c(s);
    const auto r = run<B>(c);
    for (float x : r.out) CHECK(std::isfinite(x));
  }
  SECTION("E16/E17: NaN in a used value row reaches exactly the rows that attend to it") {
    case_spec s;
    s.lq = 6;
    s.lk = 6;
    s.d = 4;
    s.causal = true;
    case_data c(s);
    c.v.view(0, 0, 3, 2) = std::numeric_limits<float>::quiet_NaN();
    const auto r = run<B>(c);
    for (index_t i = 0; i < 6; ++i) {
      bool row_nan = false;
      for (index_t d = 0; d < 4; ++d)
        row_nan |= std::isnan(r.out[static_cast<std::size_t>(i * 4 + d)]);
      INFO("row " << i);
      CHECK(row_nan == (i >= 3));  // causal: rows 3.. attend to key 3
    }
  }
  SECTION("E17: NaN in a used query row propagates to that row only") {
    case_spec s;
    s.lq = 5;
    s.lk = 5;
    s.d = 4;
    case_data c(s);
    c.q.view(0, 0, 2, 1) = std::numeric_limits<float>::quiet_NaN();
    const auto r = run<B>(c);
    for (index_t i = 0; i < 5; ++i) {
      INFO("row " << i);
      CHECK(std::isnan(r.out[static_cast<std::size_t>(i * 4)]) == (i == 2));
    }
  }
  SECTION("E21: scale 0 leaves only the ALiBi term") {
    case_spec s;
    s.lq = 1;
    s.lk = 3;
    s.d = 4;
    s.scale = 0.0f;
    case_data c(s);
    const auto r = run<B>(c);
    // One head (slope 1/256); the query sits at position 2: weights exp(-2/256), exp(-1/256), 1.
    const double w[3] = {std::exp(-2.0 / 256), std::exp(-1.0 / 256), 1.0};
    for (index_t d = 0; d < 4; ++d) {
      double num = 0;
      for (index_t j = 0; j < 3; ++j) num += w[j] * c.v.view(0, 0, j, d);
      CHECK(r.out[static_cast<std::size_t>(d)] == Approx(num / (w[0] + w[1] + w[2])).epsilon(1e-6));
    }
  }
  SECTION("E22: padding uses each sequence's true lengths; padded query rows give 0") {
    case_spec s;
    s.batch = 4;
    s.lq = 20;
    s.lk = 30;
    s.d = 8;
    s.causal = true;
    s.lengths = true;
    case_data c(s);
    const auto r = run<B>(c);
    auto at = [&](index_t b, index_t i, index_t d) {
      return static_cast<std::size_t>((b * 20 + i) * 8 + d);
    };
    for (index_t b = 0; b < 4; ++b)
      for (index_t i = c.q_lengths[static_cast<std::size_t>(b)]; i < 20; ++i) {
        CHECK(r.lse[static_cast<std::size_t>(b * 20 + i)] == -inf);
        for (index_t d = 0; d < 8; ++d) CHECK(r.out[at(b, i, d)] == 0.0f);
      }
    // Batch entry 3 (11 queries, 15 keys) equals the same sequence run alone, unpadded.
    const index_t b = 3;
    case_spec alone = s;
    alone.batch = 1;
    alone.lengths = false;
    alone.lq = c.q_lengths[b];
    alone.lk = c.k_lengths[b];
    REQUIRE(alone.lq == 11);
    REQUIRE(alone.lk == 15);
    case_data a(alone);
    for (index_t i = 0; i < alone.lq; ++i)
      for (index_t d = 0; d < 8; ++d) a.q.view(0, 0, i, d) = c.q.view(b, 0, i, d);
    for (index_t j = 0; j < alone.lk; ++j)
      for (index_t d = 0; d < 8; ++d) {
        a.k.view(0, 0, j, d) = c.k.view(b, 0, j, d);
        a.v.view(0, 0, j, d) = c.v.view(b, 0, j, d);
      }
    const auto ra = run<B>(a);
    for (index_t i = 0; i < alone.lq; ++i)
      for (index_t d = 0; d < 8; ++d)
        CHECK(ra.out[static_cast<std::size_t>(i * 8 + d)] == r.out[at(b, i, d)]);
  }
  SECTION("E23: repeated runs are bitwise identical") {
    case_spec s;
    s.batch = 2;
    s.hq = 4;
    s.hkv = 2;
    s.lq = 130;
    s.lk = 300;
    s.d = 64;
    s.causal = true;
    case_data c(s);
    const auto r0 = run<B>(c);
    const auto r1 = run<B>(c);
    CHECK(r0.out == r1.out);
    CHECK(r0.lse == r1.lse);
  }
}
