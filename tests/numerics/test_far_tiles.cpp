// SPDX-License-Identifier: MIT
// Far-tile skipping: real (tiles are skipped), exact within the tolerance rule, and backing
// off on inputs built to break a careless bound.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include "backends.hpp"
#include "common.hpp"

using alibi::index_t;
using alibi_test::case_data;
using alibi_test::case_spec;

namespace {

using alibi_test::skip_run;

// Runs the eigen backend with skipping on or off and compares it with the oracle.
skip_run run_case(case_data& c, bool skip) {
  const case_spec& s = c.spec;
  const alibi_test::oracle_result ref = alibi_test::run_oracle(c);
  const alibi_test::naive_result naive = alibi_test::run_naive_fp32(c);
  alibi_test::padded_tensor<float> out(s.batch, s.hq, s.lq, s.v_dim(), s.bshd, 1234.5f);
  std::vector<float> lse(static_cast<std::size_t>(s.batch * s.hq * s.lq));
  skip_run r;
  alibi::attention_params p = c.params;
  p.logsumexp = alibi::make_view(lse.data(), s.batch, s.hq, s.lq);
  p.skip_far_tiles = skip;
  p.stats = &r.stats;
  alibi::attention(alibi::backend::eigen{2}, c.q.view, c.k.view, c.v.view, out.view, p);
  r.cmp = alibi_test::compare(c, ref, naive, out, lse);
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.hq; ++h)
      for (index_t i = 0; i < s.lq; ++i)
        for (index_t e = 0; e < s.v_dim(); ++e) r.out.push_back(out.view(b, h, i, e));
  return r;
}

}  // namespace

TEST_CASE("far-tile skipping skips real work and stays within tolerance", "[skip][heavy]") {
  for (bool causal : {true, false}) {
    case_spec s;
    s.lq = 1500;
    s.lk = 3000;
    s.hq = 8;  // slopes 1/2 .. 1/256
    s.hkv = 4;
    s.d = 64;
    s.causal = causal;
    case_data c(s);
    const skip_run on = run_case(c, true), off = run_case(c, false);
    INFO(s.name() << ": on " << on.cmp.describe() << "; off " << off.cmp.describe());
    CHECK(on.cmp.ok());
    CHECK(off.cmp.ok());
    CHECK(off.stats.tiles_skipped == 0);
    CHECK(on.stats.tiles_skipped > 0);
    CHECK(on.stats.tiles_computed + on.stats.tiles_skipped == off.stats.tiles_computed);
    // The steep heads skip most far tiles: at least a third of all tiles go.
    CHECK(on.stats.tiles_skipped * 3 > off.stats.tiles_computed);
  }
}

TEST_CASE("far-tile skipping on decode, windows, lengths and key masks", "[skip][heavy]") {
  std::vector<case_spec> cases(3);
  cases[0].lq = 1, cases[0].lk = 9000, cases[0].hq = 4, cases[0].hkv = 1, cases[0].d = 128,
  cases[0].causal = true;
  cases[1].lq = 700, cases[1].lk = 700, cases[1].hq = 6, cases[1].hkv = 6, cases[1].d = 32,
  cases[1].window_left = 400, cases[1].batch = 3, cases[1].lengths = true;
  cases[2].lq = 600, cases[2].lk = 2000, cases[2].hq = 2, cases[2].hkv = 2, cases[2].d = 64,
  cases[2].key_mask = true, cases[2].batch = 2, cases[2].offsets = true, cases[2].bshd = true;
  for (const case_spec& s : cases) {
    case_data c(s);
    const skip_run on = run_case(c, true);
    INFO(s.name() << ": " << on.cmp.describe() << ", skipped " << on.stats.tiles_skipped);
    CHECK(on.cmp.ok());
    CHECK(on.stats.tiles_skipped > 0);
  }
}

TEST_CASE("far-tile skipping backs off on adversarial inputs", "[skip][heavy]") {
  // Query rows aligned with a few far keys of huge norm: their scores beat the ALiBi decay,
  // so a bound that ignored key norms would drop the keys that dominate the softmax.
  case_spec s;
  s.lq = 64;
  s.lk = 4096;
  s.hq = 1;  // slope 1/256
  s.hkv = 1;
  s.d = 64;
  s.slope_scale = 128.0f;  // slope 1/2: a key 3000 positions away is down-weighted by e^-1500
  s.causal = true;
  case_data c(s);
  // Keys 3700 and 3750 are 330-400 positions from the queries: bias about -180 against a
  // score of 40 |q|^2 / 8 = 320, so they dominate their rows; key 10 is too far to matter.
  for (index_t j : {10, 3700, 3750}) {
    for (index_t d = 0; d < s.d; ++d) c.k.view(0, 0, j, d) = 40.0f * c.q.view(0, 0, 63, d);
  }
  const skip_run on = run_case(c, true);
  INFO(on.cmp.describe() << ", skipped " << on.stats.tiles_skipped << " computed "
                         << on.stats.tiles_computed);
  CHECK(on.cmp.ok());
  // Without the huge keys more tiles are skipped: the bound saw them and backed off.
  case_spec benign = s;
  case_data b(benign);
  const skip_run base = run_case(b, true);
  CHECK(base.cmp.ok());
  CHECK(on.stats.tiles_skipped < base.stats.tiles_skipped);
}

TEST_CASE("far-tile skipping never engages without a positive slope", "[skip][heavy]") {
  for (float ss : {0.0f, -0.25f}) {
    case_spec s;
    s.lq = 300;
    s.lk = 2000;
    s.hq = 2;
    s.hkv = 2;
    s.d = 32;
    s.slope_scale = ss;
    case_data c(s);
    const skip_run on = run_case(c, true);
    CHECK(on.cmp.ok());
    CHECK(on.stats.tiles_skipped == 0);
  }
}

TEST_CASE("far-tile skipping with the caller's key-norm bounds", "[skip]") {
  // Bounds from alibi::key_norm_bounds give the same tiles and bits as the call's own
  // (every key valid, so both bound the same keys); looser bounds skip fewer tiles and stay
  // within tolerance; a NaN bound disables skipping for its KV head; a bounds view of the
  // wrong shape is refused by name.
  for (index_t lq : {1, 5}) {
    case_spec s;
    s.batch = 2, s.lq = lq, s.lk = 3000, s.hq = 8, s.hkv = 2, s.d = 64, s.causal = true;
    case_data c(s);
    const index_t blocks = (s.lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
    std::vector<float> bounds(static_cast<std::size_t>(s.batch * s.hkv * blocks));
    const auto bv = alibi::make_view(bounds.data(), s.batch, s.hkv, blocks);
    alibi::key_norm_bounds(alibi::tensor_view<const float, 4>(c.k.view), bv);
    {  // The same keys with the tokens outermost: the same bounds, all or from a key on.
      case_spec t = s;
      t.bshd = true;
      const case_data ct(t);  // the same values, drawn in (b, h, i, e) order
      const alibi::tensor_view<const float, 4> kt(ct.k.view);
      std::vector<float> tb(bounds.size(), -1.0f);
      const auto tv = alibi::make_view(tb.data(), s.batch, s.hkv, blocks);
      alibi::key_norm_bounds(kt, tv);
      CHECK(tb == bounds);
      std::fill(tb.begin(), tb.end(), -1.0f);
      alibi::key_norm_bounds(kt, tv, 1000);  // blocks 7.. of each (b, head)
      for (index_t x = 0; x < s.batch * s.hkv * blocks; ++x)
        CHECK(tb[static_cast<std::size_t>(x)] == (x % blocks < 1000 / alibi::key_norm_block
                                                      ? -1.0f
                                                      : bounds[static_cast<std::size_t>(x)]));
    }
    const skip_run own = run_case(c, true);
    c.params.key_norm_bounds = bv;
    const skip_run given = run_case(c, true);
    INFO(s.name() << ": own " << own.cmp.describe() << ", given " << given.cmp.describe());
    CHECK(own.cmp.ok());
    CHECK(given.cmp.ok());
    CHECK(own.stats.tiles_skipped > 0);
    CHECK(given.stats.tiles_skipped == own.stats.tiles_skipped);
    CHECK(given.stats.tiles_computed == own.stats.tiles_computed);
    REQUIRE(given.out.size() == own.out.size());
    CHECK(std::memcmp(given.out.data(), own.out.data(), own.out.size() * sizeof(float)) == 0);

    for (float& x : bounds) x *= 4.0f;
    const skip_run loose = run_case(c, true);
    CHECK(loose.cmp.ok());
    CHECK(loose.stats.tiles_skipped < own.stats.tiles_skipped);

    for (float& x : bounds) x /= 4.0f;
    bounds[0] = std::numeric_limits<float>::quiet_NaN();  // (b 0, KV head 0), block 0
    const skip_run nan = run_case(c, true);
    CHECK(nan.cmp.ok());
    CHECK(nan.stats.tiles_skipped < own.stats.tiles_skipped);

    c.params.key_norm_bounds =
        alibi::make_view<const float>(bounds.data(), s.batch, s.hkv, blocks - 1);
    CHECK_THROWS_WITH(run_case(c, true), Catch::Contains("params.key_norm_bounds must have shape"));
  }
  // The helper's own arguments.
  std::vector<float> k(2 * 300 * 8, 1.0f), b(3);
  const auto kv = alibi::make_view<const float>(k.data(), 1, 1, 300, 8);
  CHECK_THROWS_WITH(alibi::key_norm_bounds(kv, alibi::make_view(b.data(), 1, 1, 2)),
                    Catch::Contains("bounds must have shape"));
  CHECK_THROWS_WITH(alibi::key_norm_bounds(kv, alibi::make_view(b.data(), 1, 1, 3), 301),
                    Catch::Contains("first_key must be in [0, k_len = 300]"));
  alibi::key_norm_bounds(kv, alibi::make_view(b.data(), 1, 1, 3));
  // |k| = sqrt(8) for every key, rounded up by a margin below 1e-5 relative.
  for (float x : b) {
    CHECK(x >= std::sqrt(8.0f));
    CHECK(x < std::sqrt(8.0f) * (1 + 1e-5f));
  }
}

TEST_CASE("the side tests every skipping backend shares (detail::left/right_negligible)",
          "[skip]") {
  using alibi::detail::far_row;
  using alibi::detail::far_tile_bound;
  const far_tile_bound bd = far_tile_bound::make(1.0f, 1.0f);  // scale 1, slope 1
  // A row at t0 = 1000 with keys [0, 1001), having seen a score of 0 (base 2) with sum 1.
  far_row r;
  r.t0 = 1000, r.begin = 0, r.end = 1001, r.shift = 0, r.qnorm = 1.0f;
  r.state.m = 0.0f, r.state.l = 1.0f;
  // Keys 100 and more positions away: exp(1 - 100) / (1 - e^-1) is far below 2^-25.
  CHECK(alibi::detail::left_negligible(bd, r, 1.0f, 901));
  // 10 positions away: exp(1 - 10) / (1 - e^-1) = 2e-4 is not.
  CHECK_FALSE(alibi::detail::left_negligible(bd, r, 1.0f, 991));
  // Larger key norms back the bound off: |q| |k| = 200 against a distance of 100.
  CHECK_FALSE(alibi::detail::left_negligible(bd, r, 200.0f, 901));
  // Keys right of the row's own position are not "left" of it: never skipped from the left.
  far_row wide = r;
  wide.end = 2000;
  CHECK_FALSE(alibi::detail::left_negligible(bd, wide, 1.0f, 1006));
  // No key on that side: nothing to compute, so negligible.
  CHECK(alibi::detail::right_negligible(bd, r, 1.0f, 1001));
  r.begin = 950;
  CHECK(alibi::detail::left_negligible(bd, r, 1.0f, 900));
  // Right side: keys from 1100 on, for a row that sees up to 2000.
  r.begin = 0, r.end = 2000;
  CHECK(alibi::detail::right_negligible(bd, r, 1.0f, 1100));
  CHECK_FALSE(alibi::detail::right_negligible(bd, r, 1.0f, 1005));
  // The distance shift counts: a row whose nearest allowed key is 90 away (window) has its
  // scores computed with 90 subtracted from every distance.
  r.shift = 90;
  CHECK_FALSE(alibi::detail::right_negligible(bd, r, 1.0f, 1100));
  r.shift = 0;
  // An empty state (nothing seen yet), a NaN state or a NaN norm never skips.
  far_row e = r;
  e.state = alibi::detail::softmax_state{};
  CHECK_FALSE(alibi::detail::right_negligible(bd, e, 1.0f, 1100));
  e.state.m = e.state.l = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(alibi::detail::right_negligible(bd, e, 1.0f, 1100));
  CHECK_FALSE(
      alibi::detail::right_negligible(bd, r, std::numeric_limits<float>::quiet_NaN(), 1100));
  // Slope 0 or negative: no bound.
  for (float slope : {0.0f, -0.5f})
    CHECK_FALSE(alibi::detail::right_negligible(far_tile_bound::make(1.0f, slope), r, 1.0f, 1100));
}

TEST_CASE("far_tile_bound::min_distance is the root of the side test in the distance", "[skip]") {
  using alibi::detail::far_tile_bound;
  using alibi::detail::softmax_state;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float slope : {0.7071f, 0.0625f, 1.0f / 256}) {
    for (float qk : {0.5f, 8.0f, 40.0f}) {
      for (alibi::index_t shift : {0, 37}) {
        const far_tile_bound bd = far_tile_bound::make(0.125f, slope);
        softmax_state st;
        st.m = 3.5f, st.l = 17.0f;
        const double d = bd.min_distance(st, qk, qk, shift);
        INFO("slope " << slope << ", |q| = |k| = " << qk << ", shift " << shift << ": " << d);
        REQUIRE(std::isfinite(d));
        // Just past the root the test holds, just short of it it does not.
        const auto past = static_cast<alibi::index_t>(std::ceil(d)) + 1;
        const auto short_of = static_cast<alibi::index_t>(std::floor(d)) - 1;
        CHECK(bd.negligible(st, qk, qk, past, shift));
        CHECK_FALSE(bd.negligible(st, qk, qk, short_of, shift));
      }
    }
  }
  // No weight yet, a NaN state or norm, a non-positive slope: never.
  const far_tile_bound bd = far_tile_bound::make(1.0f, 0.5f);
  CHECK(std::isinf(bd.min_distance(softmax_state{}, 1.0f, 1.0f, 0)));
  softmax_state st;
  st.m = 0.0f, st.l = 1.0f;
  CHECK(std::isinf(bd.min_distance(st, nan, 1.0f, 0)));
  CHECK(std::isinf(bd.min_distance(st, 1.0f, nan, 0)));
  CHECK(std::isinf(far_tile_bound::make(1.0f, 0.0f).min_distance(st, 1.0f, 1.0f, 0)));
  st.l = nan;
  CHECK(std::isinf(bd.min_distance(st, 1.0f, 1.0f, 0)));
}
