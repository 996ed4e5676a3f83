// SPDX-License-Identifier: MIT
// The paged cache's own guarantees, beside the attention it feeds: sizes that cannot be held
// are refused with the arguments named; a transaction returns a sequence truncated while it
// was open to the fewest tokens it held, with the key-norm bounds of the keys left, bitwise
// (kv_cache's: test_layers.cpp); a batch's page count is exact when its
// sequences share a last page; a truncated page's bound is that of its remaining keys;
// int8 rows too small for a scale read back as zeros.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <alibi/serving.hpp>
#include <catch2/catch.hpp>

using alibi::index_t;

namespace {

std::vector<float> uniform(index_t n, unsigned seed, float amp = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = u(rng);
  return x;
}

/// Appends n tokens (n, H, D) of k and v to a paged cache's sequence.
template <class T>
void append(alibi::paged_kv_cache<T>& cache, index_t seq, const std::vector<float>& k,
            const std::vector<float>& v, index_t n) {
  const index_t H = cache.kv_heads(), D = cache.head_dim();
  cache.append(seq, alibi::make_view<const float>(k.data(), n, H, D),
               alibi::make_view<const float>(v.data(), n, H, D));
}

/// A page's key-norm bounds (kv_heads).
template <class T>
std::vector<float> page_bounds(const alibi::paged_kv_cache<T>& cache, index_t page) {
  const alibi::paged_kv<T> v = cache.view();
  std::vector<float> b;
  for (index_t h = 0; h < cache.kv_heads(); ++h) b.push_back(v.page_key_norms(page, h));
  return b;
}

}  // namespace

TEST_CASE("paged_kv_cache: sizes that do not fit are refused with the arguments named",
          "[layers][cache]") {
  using cache = alibi::paged_kv_cache<float>;
  // num_pages * page_size * kv_heads wraps in int64: it once allocated an empty pool.
  REQUIRE_THROWS_WITH(cache(index_t(1) << 24, index_t(1) << 30, index_t(1) << 20, 1, 1, 1),
                      Catch::Contains("must fit in 64 bits"));
  // ... and in bytes.
  REQUIRE_THROWS_WITH(cache(index_t(1) << 20, index_t(1) << 20, 1, index_t(1) << 22, 1, 1),
                      Catch::Contains("must fit in 64 bits"));
  REQUIRE_THROWS_WITH(cache(1, 1, 1, 1, index_t(1) << 40, index_t(1) << 30),
                      Catch::Contains("max_seqs * max_pages_per_seq"));
  // Entries that fit while their bytes do not: the block table's, the lengths'.
  REQUIRE_THROWS_WITH(cache(1, 1, 1, 1, index_t(1) << 61, 1),
                      Catch::Contains("max_seqs * max_pages_per_seq block-table entries"));
  REQUIRE_THROWS_WITH(cache(1, 1, 1, 1, index_t(1) << 61, 0), Catch::Contains("max_seqs lengths"));
  // Page ids are int32 in the block table.
  REQUIRE_THROWS_WITH(cache(index_t(1) << 31, 1, 1, 1, 1, 1), Catch::Contains("num_pages"));
  // v_head_dim: -1 means head_dim; other negative values are errors.
  REQUIRE(cache(1, 4, 1, 8, 1, 1).v_head_dim() == 8);
  REQUIRE_THROWS_AS(cache(1, 4, 1, 8, 1, 1, -7), alibi::argument_error);
  REQUIRE_THROWS_AS(cache(1, 4, 1, 8, 1, 1, 0), alibi::argument_error);
}

TEST_CASE("paged_kv_cache: a transaction refuses sequences it cannot hold", "[layers][cache]") {
  alibi::paged_kv_cache<float> cache(4, 4, 1, 8, 2, 2);
  const index_t a = cache.add_sequence();
  using tx = alibi::paged_kv_cache<float>::transaction;
  REQUIRE_THROWS_WITH(tx(cache, alibi::make_view<const index_t>(nullptr, 1)),
                      Catch::Contains("seqs"));
  const index_t bad[] = {a, 1};
  REQUIRE_THROWS_WITH(tx(cache, alibi::make_view<const index_t>(bad, 2)),
                      Catch::Contains("not an active sequence"));
  REQUIRE_NOTHROW(tx(cache, alibi::make_view<const index_t>(bad, 1)));
  REQUIRE_NOTHROW(tx(cache, alibi::make_view<const index_t>(nullptr, 0)));
}

TEST_CASE("paged_kv_cache: a transaction returns truncated sequences to their fewest tokens",
          "[layers][cache]") {
  const index_t H = 2, D = 8, ps = 4;
  alibi::paged_kv_cache<float> cache(16, ps, H, D, 3, 8);
  const auto k = uniform(20 * H * D, 1), v = uniform(20 * H * D, 2);
  const auto k2 = uniform(20 * H * D, 3, 100.0f), v2 = uniform(20 * H * D, 4);
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  append(cache, a, k, v, 7);
  append(cache, b, k, v, 5);
  // The state to compare with: a cache that only ever held a's first 2 tokens and b's 5.
  alibi::paged_kv_cache<float> want(16, ps, H, D, 3, 8);
  const index_t wa = want.add_sequence(), wb = want.add_sequence();
  append(want, wa, k, v, 2);
  append(want, wb, k, v, 5);
  const std::vector<float> want_a = page_bounds(want, want.page_of(wa, 0));
  const index_t seqs[] = {a, b};
  {
    alibi::paged_kv_cache<float>::transaction step(cache, alibi::make_view<const index_t>(seqs, 2));
    cache.truncate(a, 2);
    append(cache, a, k2, v2, 9);  // other tokens where a's used to be
    cache.free_sequence(b);       // b ends, and its slot holds another sequence
    REQUIRE(cache.add_sequence() == b);
    append(cache, b, k2, v2, 3);
  }
  REQUIRE(cache.length(a) == 2);
  REQUIRE(cache.length(b) == 3);  // the new sequence in b's slot is not the transaction's
  REQUIRE(cache.pages_in_use() == 2);
  const alibi::paged_kv<float> view = cache.view();
  for (index_t j = 0; j < 2; ++j)
    for (index_t h = 0; h < H; ++h)
      for (index_t e = 0; e < D; ++e)
        REQUIRE(view.k(cache.page_of(a, j), j, h, e) == k[(j * H + h) * D + e]);
  // The bound of a's page is that of its 2 keys, not of the 100x keys appended and undone.
  REQUIRE(page_bounds(cache, cache.page_of(a, 0)) == want_a);
  // A committed transaction changes nothing afterwards.
  {
    alibi::paged_kv_cache<float>::transaction step(cache, alibi::make_view<const index_t>(seqs, 1));
    append(cache, a, k, v, 3);
    step.commit();
    cache.truncate(a, 1);
  }
  REQUIRE(cache.length(a) == 1);
}

TEST_CASE("paged_kv_cache: truncation bounds a page by the keys it keeps", "[layers][cache]") {
  const index_t H = 2, D = 8, ps = 8;
  alibi::paged_kv_cache<std::int8_t> cache(8, ps, H, D, 3, 4);
  alibi::paged_kv_cache<std::int8_t> want(8, ps, H, D, 1, 4);
  const auto k = uniform(16 * H * D, 5), v = uniform(16 * H * D, 6);
  auto big = uniform(16 * H * D, 7, 1e6f);
  big[3] = std::numeric_limits<float>::quiet_NaN();  // a rejected token with a NaN key
  const index_t a = cache.add_sequence(), wa = want.add_sequence();
  append(cache, a, k, v, 11);
  append(want, wa, k, v, 11);
  const std::vector<float> eleven = page_bounds(want, want.page_of(wa, 8));
  // Speculative tokens with NaN and huge keys, rejected.
  cache.append(a, alibi::make_view<const float>(big.data(), 4, H, D),
               alibi::make_view<const float>(v.data(), 4, H, D));
  REQUIRE(std::isnan(page_bounds(cache, cache.page_of(a, 8))[0]));
  cache.truncate(a, 11);
  REQUIRE(page_bounds(cache, cache.page_of(a, 8)) == eleven);
  // A page held by another sequence keeps the bound of every holder's keys.
  const index_t b = cache.fork(a);
  cache.append(b, alibi::make_view<const float>(big.data() + 2 * H * D, 1, H, D),
               alibi::make_view<const float>(v.data(), 1, H, D));  // b copies the page
  const std::vector<float> shared = page_bounds(cache, cache.page_of(a, 0));
  const index_t c = cache.fork(a);
  cache.truncate(c, 3);  // c ends inside page 0, which a and b still hold
  REQUIRE(page_bounds(cache, cache.page_of(a, 0)) == shared);
  // Truncating to a page boundary leaves the page whole.
  cache.truncate(a, 8);
  REQUIRE(page_bounds(cache, cache.page_of(a, 0)) == shared);
}

TEST_CASE("paged_kv_cache: a batch's pages count one copy per holder that needs one",
          "[layers][cache]") {
  const index_t H = 1, D = 4, ps = 4;
  alibi::paged_kv_cache<float> cache(8, ps, H, D, 4, 4);
  const auto k = uniform(8 * H * D, 8), v = uniform(8 * H * D, 9);
  const index_t a = cache.add_sequence();
  append(cache, a, k, v, 5);  // page 1 holds 1 token
  const index_t b = cache.fork(a);
  using appends = std::vector<std::pair<index_t, index_t>>;
  auto fresh = [&](const appends& x) { return cache.batch_fresh_pages(x.begin(), x.end()); };
  // a and b hold page 1 alone: the first to append copies it, the second finds it unshared.
  REQUIRE(fresh({{a, 1}, {b, 1}}) == 1);
  REQUIRE(cache.fresh_pages(a, 1) == 1);
  REQUIRE(fresh({{a, 4}, {b, 0}}) == 2);  // a copy and one new page; b appends nothing
  const index_t c = cache.fork(a);
  REQUIRE(fresh({{a, 1}, {b, 1}}) == 2);  // c holds it too
  REQUIRE(fresh({{a, 1}, {b, 1}, {c, 1}}) == 2);
  const index_t before = cache.free_pages();
  for (const index_t s : {a, b, c}) append(cache, s, k, v, 1);
  REQUIRE(before - cache.free_pages() == 2);
}

TEST_CASE("paged_kv_cache: int8 rows at float's top read back finite", "[layers][cache]") {
  // max|x| / 127 rounds up at FLT_MAX, and 127 times it was inf.
  std::vector<std::int8_t> q(3, 0);
  constexpr float top = std::numeric_limits<float>::max();
  const float row[] = {top, -top, 1.0f};
  const float s = alibi::paged_kv_cache<std::int8_t>::quantize_int8(row, 1, 3, q.data());
  for (int e = 0; e < 3; ++e) {
    const float back = static_cast<float>(q[static_cast<std::size_t>(e)]) * s;
    REQUIRE(std::isfinite(back));
    REQUIRE(std::fabs(back - row[e]) <= top / 254.0f * 1.01f);
  }
}

TEST_CASE("paged_kv_cache: append refuses K/V views that are not memory", "[layers][cache]") {
  alibi::paged_kv_cache<float> cache(4, 4, 1, 2, 1, 2);
  cache.add_sequence();
  std::vector<float> k(6), v(6);
  // Token t at t * 2^62: the third token's offset, 2^63, does not fit.
  const index_t huge = index_t{1} << 62;
  const auto kv = alibi::make_strided_view<const float, 3>(k.data(), {3, 1, 2}, {huge, 2, 1});
  REQUIRE_THROWS_WITH(cache.append(0, kv, alibi::make_view<const float>(v.data(), 3, 1, 2)),
                      Catch::Contains("alibi::paged_kv_cache::append: k's extents and strides "
                                      "reach past a 64-bit element offset"));
  REQUIRE(cache.length(0) == 0);
}

TEST_CASE("paged_kv_cache: int8 rows of subnormal magnitude stay within scale / 2",
          "[layers][cache]") {
  using cache = alibi::paged_kv_cache<std::int8_t>;
  std::vector<std::int8_t> q(4, 5);
  const float zeros[] = {0.0f, -0.0f, 0.0f, 0.0f};
  REQUIRE(cache::quantize_int8(zeros, 1, 4, q.data()) == 0.0f);
  for (const std::int8_t e : q) REQUIRE(e == 0);
  // Rows whose max|x| is m x 2^-149: their scale is subnormal, on a grid of 2^-149. Every
  // element reads back within scale / 2 (subnormal products of an int8 and a subnormal are
  // exact), and the scale is at most one grid step above max|x| / 127.
  const float unit = std::numeric_limits<float>::denorm_min();
  for (int m = 1; m < 40000; m += (m < 400 ? 1 : 97)) {
    const float amax = static_cast<float>(m) * unit;
    const float row[] = {amax, -amax / 2, amax / 3, -static_cast<float>(m / 7) * unit};
    const float s = cache::quantize_int8(row, 1, 4, q.data());
    INFO("m = " << m << ", scale = " << s / unit << " x 2^-149");
    REQUIRE(s >= amax / 127.0f);
    REQUIRE(s <= amax / 127.0f + unit);
    for (int e = 0; e < 4; ++e)
      REQUIRE(std::fabs(static_cast<float>(q[static_cast<std::size_t>(e)]) * s - row[e]) <= s / 2);
  }
}
