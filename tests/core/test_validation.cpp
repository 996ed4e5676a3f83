// SPDX-License-Identifier: MIT
// Bad input gets an alibi::error naming the argument and what was expected, from
// attention() and, without throwing, from can_implement().
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>

#include "call_fixture.hpp"

using alibi::index_t;
using Catch::Contains;

using fixture = alibi_test::call_fixture;
using alibi_test::message_of;

TEST_CASE("a valid call passes the check", "[validation]") {
  fixture f;
  CHECK(alibi::can_implement(alibi::backend::eigen{}, f.q, f.k, f.v, f.out).ok());
  CHECK_NOTHROW(alibi::attention(alibi::backend::eigen{}, f.q, f.k, f.v, f.out));
}

TEST_CASE("shape errors name the argument and the expectation", "[validation]") {
  const alibi::backend::eigen be{};
  {
    fixture f;
    f.k.extents[1] = 3;
    f.v.extents[1] = 3;
    CHECK_THROWS_WITH(
        alibi::attention(be, f.q, f.k, f.v, f.out),
        Contains("k.extent(1) (kv heads) must divide q.extent(1) (q heads) = 4, got 3"));
    CHECK(message_of(be, f) != "ok");
  }
  {
    fixture f;
    f.k.extents[3] = 4;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("k.extent(3) (head_dim) must equal q.extent(3) = 8, got 4"));
  }
  {
    fixture f;
    f.out.extents[2] = 4;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out), Contains("out must have shape"));
  }
  {
    fixture f;
    f.v.extents[2] = 6;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("v must have k's heads and length"));
  }
  {
    fixture f;
    f.k.extents[0] = 1;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out), Contains("batch extent"));
  }
  {
    fixture f;
    f.q.extents[2] = -1;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("q.extent(2) must be >= 0, got -1"));
  }
  {
    fixture f;
    f.k.extents[1] = 0;
    f.v.extents[1] = 0;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("kv heads) must be > 0"));
  }
}

TEST_CASE("layout errors: non-contiguous head_dim, null data, offset overflow", "[validation]") {
  const alibi::backend::eigen be{};
  {
    fixture f;
    f.q.strides[3] = 2;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("q.stride(3) (head_dim) must be 1 (contiguous), got 2"));
  }
  {
    fixture f;
    f.v.data = nullptr;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("v.data is null but v has"));
  }
  {
    fixture f;
    f.k.strides[0] = std::numeric_limits<index_t>::max() / 2;
    f.k.strides[1] = std::numeric_limits<index_t>::max() / 2;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out),
                      Contains("reach past a 64-bit element offset"));
  }
}

TEST_CASE("parameter errors", "[validation]") {
  const alibi::backend::eigen be{};
  fixture f;
  {
    alibi::attention_params p;
    p.scale = std::numeric_limits<float>::infinity();
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("params.scale must be finite"));
  }
  {
    alibi::attention_params p;
    p.mask.window_right = std::numeric_limits<index_t>::max();
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("must be in [0, 2^60), or -1 for unbounded"));
  }
  {
    alibi::attention_params p;
    p.mask.window_left = -3;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("window_left/window_right must be in [0, 2^60)"));
  }
  {
    std::vector<index_t> lens = {5, 9};
    alibi::attention_params p;
    p.k_lengths = alibi::make_view<const index_t>(lens.data(), 2);
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("params.k_lengths(1) must be in [0, k_len = 7], got 9"));
  }
  {
    std::vector<index_t> lens = {5, 5, 5};
    alibi::attention_params p;
    p.q_lengths = alibi::make_view<const index_t>(lens.data(), 3);
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("params.q_lengths must have shape (batch)"));
  }
  {
    std::vector<float> slopes(3, 0.1f);
    alibi::attention_params p;
    p.slopes = alibi::slope_config::per_head(slopes.data(), 3);
    CHECK_THROWS_WITH(
        alibi::attention(be, f.q, f.k, f.v, f.out, p),
        Contains("params.slopes.values must have shape (1 or batch = 2, q_heads = 4)"));
  }
  {
    alibi::attention_params p;
    p.slopes.global_heads = 6;
    p.slopes.head_offset = 4;
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("must lie within [0, global_heads = 6)"));
  }
  {
    std::vector<char> mask(2 * 6, 0);
    alibi::attention_params p;
    p.key_mask = alibi::make_view<const bool>(reinterpret_cast<const bool*>(mask.data()), 2, 6);
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("params.key_mask must have shape (batch, k_len)"));
  }
  {
    std::vector<float> lse(2 * 4 * 4);
    alibi::attention_params p;
    p.logsumexp = alibi::make_view(lse.data(), 2, 4, 4);
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("params.logsumexp must have shape (batch, q_heads, q_len)"));
  }
  {
    std::vector<index_t> offs = {index_t(1) << 60, 0};
    alibi::attention_params p;
    p.q_offsets = alibi::make_view<const index_t>(offs.data(), 2);
    CHECK_THROWS_WITH(alibi::attention(be, f.q, f.k, f.v, f.out, p),
                      Contains("magnitude below 2^60"));
  }
}

TEST_CASE("the same checks run for the reference backend and fill_bias", "[validation]") {
  fixture f;
  f.k.extents[1] = 3;
  f.v.extents[1] = 3;
  CHECK_THROWS_AS(alibi::attention(alibi::backend::reference{}, f.q, f.k, f.v, f.out),
                  alibi::error);
  std::vector<float> bias(2 * 3 * 4);
  std::vector<index_t> lens = {9};
  alibi::attention_params p;
  p.k_lengths = alibi::make_view<const index_t>(lens.data(), 1);
  CHECK_THROWS_WITH(
      alibi::fill_bias(alibi::make_view(bias.data(), 1, 2, 3, 4), p),
      Contains("alibi::fill_bias: params.k_lengths(0) must be in [0, k_len = 4], got 9"));
  CHECK_THROWS_WITH(alibi::bias_matrix(-1, 2, 2),
                    Contains("alibi::bias_matrix: heads, q_len and k_len must be >= 0"));
  // out over the caller's slopes (head 0's row wrote head 1's slope before it was read), and
  // an out whose elements overlap: refused, as attention() refuses them for its out.
  std::vector<float> both = {0.5f, 0.25f, 0, 0, 0, 0, 0, 0};
  alibi::attention_params ps;
  ps.slopes.values = alibi::make_view<const float>(both.data(), 1, 2);
  CHECK_THROWS_WITH(alibi::fill_bias(alibi::make_view(both.data(), 1, 2, 2, 2), ps),
                    Contains("out and params.slopes.values share memory"));
  CHECK_THROWS_WITH(
      alibi::fill_bias(alibi::make_strided_view<float, 4>(bias.data(), {1, 2, 3, 4}, {0, 0, 0, 0})),
      Contains("out's elements must not overlap"));
  REQUIRE_NOTHROW(alibi::fill_bias(alibi::make_view(both.data() + 2, 1, 2, 1, 3), ps));
}

TEST_CASE("tensor_view converts T to const T only", "[validation]") {
  // The conversion's element type is deduced from the target: before, any element type
  // converted to any const one, and the conversion called itself until the stack overflowed.
  STATIC_REQUIRE(
      std::is_convertible<alibi::tensor_view<float, 3>, alibi::tensor_view<const float, 3>>::value);
  STATIC_REQUIRE_FALSE(std::is_convertible<alibi::tensor_view<double, 3>,
                                           alibi::tensor_view<const float, 3>>::value);
  STATIC_REQUIRE_FALSE(std::is_convertible<alibi::tensor_view<float, 3>,
                                           alibi::tensor_view<const double, 3>>::value);
  STATIC_REQUIRE_FALSE(
      std::is_convertible<alibi::tensor_view<const float, 3>, alibi::tensor_view<float, 3>>::value);
  double d[8] = {};
  const alibi::tensor_view<double, 3> a = alibi::make_view(d, 2, 2, 2);
  const alibi::tensor_view<const double, 3> c = a;
  CHECK(c.data == d);
  CHECK(c.extents[2] == 2);
  CHECK(c.strides[0] == 4);
}

// Regression tests: each case failed (or crashed) before its fix.

TEST_CASE("zero query heads with zero kv heads is an empty problem", "[validation]") {
  fixture f(2, 0, 0, 3, 5, 8);
  const alibi::backend::eigen e1{1}, e2{2};
  const alibi::backend::reference ref{};
  REQUIRE(message_of(e1, f) == "ok");
  REQUIRE(message_of(e2, f) == "ok");
  REQUIRE(message_of(ref, f) == "ok");
  REQUIRE_NOTHROW(alibi::attention(e1, f.q, f.k, f.v, f.out));
  REQUIRE_NOTHROW(alibi::attention(e2, f.q, f.k, f.v, f.out));
  REQUIRE_NOTHROW(alibi::attention(ref, f.q, f.k, f.v, f.out));
  // Zero query heads with kv heads present is empty too.
  fixture g(2, 0, 2, 3, 5, 8);
  REQUIRE_NOTHROW(alibi::attention(e2, g.q, g.k, g.v, g.out));
  REQUIRE_NOTHROW(alibi::attention(ref, g.q, g.k, g.v, g.out));

  // The head mapping itself never divides by zero.
  alibi::detail::attention_problem p;
  p.q_heads = 0;
  p.kv_heads = 0;
  REQUIRE(p.group_size() >= 1);
  REQUIRE(p.kv_head(0) == 0);
  p.kv_heads = 4;
  REQUIRE(p.group_size() >= 1);
  REQUIRE(p.kv_head(0) == 0);
  p.q_heads = 8;
  p.kv_heads = 2;
  REQUIRE(p.group_size() == 4);
  REQUIRE(p.kv_head(7) == 1);
}

TEST_CASE("element counts that overflow int64 are refused", "[validation]") {
  float x = 0.0f;
  const index_t big = index_t(1) << 32;
  const auto huge = alibi::make_strided_view<float, 2>(&x, {big, big}, {0, 0});
  const alibi::status s = alibi::detail::check_view("alibi::attention", "q", huge);
  REQUIRE_FALSE(s.ok());
  REQUIRE_THAT(s.message(), Contains("q") && Contains("element count"));
  // An empty view with huge other extents has 0 elements: fine.
  const auto empty = alibi::make_strided_view<float, 3>(&x, {big, big, 0}, {0, 0, 1});
  REQUIRE(alibi::detail::check_view("alibi::attention", "q", empty).ok());

  // Through the front end: a stride-0 q of 2^32 x 2^32 rows used to pass can_implement.
  const auto q = alibi::make_strided_view<float, 4>(&x, {big, big, 1, 1}, {0, 0, 0, 1});
  const auto kv = alibi::make_strided_view<float, 4>(&x, {big, 1, 1, 1}, {0, 0, 0, 1});
  std::vector<float> o(1);
  const auto out = alibi::make_strided_view<float, 4>(o.data(), {big, big, 1, 1}, {0, 0, 0, 1});
  const alibi::status f = alibi::can_implement(alibi::backend::reference{}, q, kv, kv, out);
  REQUIRE_FALSE(f.ok());
  REQUIRE_THAT(f.message(), Contains("q's element count"));
}

TEST_CASE("out and logsumexp must not overlap themselves", "[validation]") {
  const alibi::backend::reference ref{};
  fixture f;  // (2, 4, 2, 5, 7, 8)
  REQUIRE(message_of(ref, f) == "ok");
  // Rows that overlap: a row stride (4) smaller than the row (8 values).
  fixture g;
  g.out = alibi::make_strided_view<float, 4>(g.ob.data(), {2, 4, 5, 8}, {80, 20, 4, 1});
  REQUIRE_THAT(message_of(ref, g), Contains("out's elements must not overlap"));
  // A stride of 0 on the batch.
  g.out = alibi::make_strided_view<float, 4>(g.ob.data(), {2, 4, 5, 8}, {0, 40, 8, 1});
  REQUIRE_THAT(message_of(ref, g), Contains("out's elements must not overlap"));
  // Heads interleaved onto the same rows: head h and row i + 1 of head h - 1 collide.
  g.out = alibi::make_strided_view<float, 4>(g.ob.data(), {2, 4, 5, 8}, {160, 8, 8, 1});
  REQUIRE_THAT(message_of(ref, g), Contains("out's elements must not overlap"));
  // Fine: a permuted (batch, seq, heads, dim) layout, and a stride 0 on an extent of 1.
  g.out = alibi::view_bshd(g.ob.data(), 2, 5, 4, 8);
  REQUIRE(message_of(ref, g) == "ok");
  fixture one(1, 4, 2, 5, 7, 8);
  one.out = alibi::make_strided_view<float, 4>(one.ob.data(), {1, 4, 5, 8}, {0, 40, 8, 1});
  REQUIRE(message_of(ref, one) == "ok");
  // Inputs may alias: q, k and v broadcast over the batch with a stride of 0.
  fixture in;
  in.q = alibi::make_strided_view<float, 4>(in.qb.data(), {2, 4, 5, 8}, {0, 40, 8, 1});
  in.k = alibi::make_strided_view<float, 4>(in.kb.data(), {2, 2, 7, 8}, {0, 0, 8, 1});
  in.v = in.k;
  REQUIRE(message_of(ref, in) == "ok");
  REQUIRE(message_of(alibi::backend::eigen{2}, in) == "ok");

  // logsumexp is an output too.
  std::vector<float> lse(2 * 4 * 5);
  alibi::attention_params p;
  p.logsumexp = alibi::make_strided_view<float, 3>(lse.data(), {2, 4, 5}, {0, 5, 1});
  REQUIRE_THAT(message_of(ref, f, p), Contains("params.logsumexp's elements must not overlap"));
  p.logsumexp = alibi::make_view(lse.data(), 2, 4, 5);
  REQUIRE(message_of(ref, f, p) == "ok");
}

TEST_CASE("an output must not share memory with another argument", "[validation]") {
  const alibi::backend::reference ref{};
  const alibi::backend::eigen eig{2};
  {  // In place over the queries.
    fixture f;
    f.out = f.q;
    REQUIRE_THAT(message_of(ref, f), Contains("out and q share memory"));
    REQUIRE_THAT(message_of(eig, f), Contains("out and q share memory"));
    CHECK_THROWS_WITH(alibi::attention(eig, f.q, f.k, f.v, f.out),
                      Contains("out is written by this call"));
  }
  {  // One element of v (its last) under out's first; out's other elements are its own.
    fixture f(1, 2, 2, 1, 1, 4);
    std::vector<float> both(16, 0.5f);
    f.v = alibi::make_view(both.data(), 1, 2, 1, 4);
    f.out = alibi::make_view(both.data() + 7, 1, 2, 1, 4);
    REQUIRE_THAT(message_of(ref, f), Contains("out and v share memory"));
    f.out = alibi::make_view(both.data() + 8, 1, 2, 1, 4);
    REQUIRE(message_of(ref, f) == "ok");  // adjacent, not overlapping
  }
  {  // The logsumexp inside out's buffer, and the key-norm bounds under the logsumexp.
    fixture f;
    alibi::attention_params p;
    p.logsumexp = alibi::make_view(f.ob.data() + 3, 2, 4, 5);
    REQUIRE_THAT(message_of(ref, f, p), Contains("out and params.logsumexp share memory"));
    std::vector<float> lse(2 * 4 * 5);
    p.logsumexp = alibi::make_view(lse.data(), 2, 4, 5);
    p.key_norm_bounds = alibi::make_view<const float>(lse.data() + 1, 2, 2, 1);
    REQUIRE_THAT(message_of(ref, f, p),
                 Contains("params.logsumexp and params.key_norm_bounds share memory"));
  }
  {  // A packed (batch, seq, 4, heads, dim) buffer: q, k, v and out each in a slot of their
     // own interleave without sharing an element; out in k's slot does share.
    const index_t B = 2, L = 5, H = 2, D = 8;
    std::vector<float> packed(static_cast<std::size_t>(B * L * 4 * H * D), 0.25f);
    auto slot = [&](int s) {
      return alibi::make_strided_view<float, 4>(packed.data() + s * H * D, {B, H, L, D},
                                                {L * 4 * H * D, D, 4 * H * D, 1});
    };
    fixture f(B, H, H, L, L, D);
    f.q = slot(0);
    f.k = slot(1);
    f.v = slot(2);
    f.out = slot(3);
    REQUIRE(message_of(ref, f) == "ok");
    REQUIRE_NOTHROW(alibi::attention(eig, f.q, f.k, f.v, f.out));
    f.out = slot(1);
    REQUIRE_THAT(message_of(ref, f), Contains("out and k share memory"));
  }
}

TEST_CASE("key_norm_bounds and make_view check what they are given", "[validation]") {
  // key_norm_bounds once read through offsets that wrap (a crash, or wrong bounds); its
  // bounds may not overlap themselves or k.
  std::vector<float> k(8, 1.0f), bounds(2);
  const index_t huge = (index_t{1} << 62) + 1000;
  const auto bad_k =
      alibi::make_strided_view<const float, 4>(k.data(), {1, 2, 2, 1}, {0, huge, huge, 1});
  REQUIRE_THROWS_WITH(alibi::key_norm_bounds(bad_k, alibi::make_view(bounds.data(), 1, 2, 1)),
                      Contains("alibi::key_norm_bounds: k's extents and strides reach past"));
  const auto good_k = alibi::make_view<const float>(k.data(), 1, 2, 2, 2);
  REQUIRE_THROWS_WITH(alibi::key_norm_bounds(good_k, alibi::make_strided_view<float, 3>(
                                                         bounds.data(), {1, 2, 1}, {2, 0, 1})),
                      Contains("bounds's elements must not overlap"));
  REQUIRE_THROWS_WITH(
      alibi::key_norm_bounds(good_k, alibi::make_view(const_cast<float*>(k.data()), 1, 2, 1)),
      Contains("bounds and k share memory"));
  REQUIRE_NOTHROW(alibi::key_norm_bounds(good_k, alibi::make_view(bounds.data(), 1, 2, 1)));
  REQUIRE(bounds[0] >= std::sqrt(2.0f));
  {             // Bounds given to a call: each >= 0 or NaN (skipping off for its KV head), on host
                // backends, which read them; a negative one is no bound on any norm.
    fixture f;  // (batch 2, kv_heads 2, k_len 7): one block of keys per KV head
    std::vector<float> given{1.0f, 0.0f, std::nanf(""), INFINITY};
    alibi::attention_params p;
    p.key_norm_bounds = alibi::make_view<const float>(given.data(), 2, 2, 1);
    REQUIRE(message_of(alibi::backend::eigen{1}, f, p) == "ok");
    REQUIRE(message_of(alibi::backend::reference{}, f, p) == "ok");
    for (const float bad : {-1.0f, -1e-30f, -INFINITY}) {
      given[2] = bad;
      REQUIRE_THAT(message_of(alibi::backend::eigen{1}, f, p),
                   Contains("params.key_norm_bounds(1, 0, 0) must be >= 0"));
      REQUIRE_THAT(message_of(alibi::backend::reference{}, f, p),
                   Contains("params.key_norm_bounds(1, 0, 0) must be >= 0"));
    }
    given[2] = -0.0f;  // a zero of either sign bounds a zero key
    REQUIRE(message_of(alibi::backend::eigen{1}, f, p) == "ok");
  }
  // make_view of more elements than int64 holds: no signed overflow (UBSan), and the front
  // end names the element count.
  fixture f;
  f.q = alibi::make_view(f.qb.data(), index_t{1} << 40, index_t{1} << 40, 1, 1);
  REQUIRE_THAT(message_of(alibi::backend::reference{}, f), Contains("q's element count"));
}

TEST_CASE("views_share_bytes agrees with enumerating both views' bytes", "[validation]") {
  // Random strided layouts in one buffer (negative, zero and interleaving strides), float
  // against float and against 2-byte elements: the test is exact, not a span test.
  std::vector<float> buf(4096);
  const char* base = reinterpret_cast<const char*>(buf.data());
  auto bytes_of = [&](const auto& v) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(v.data)>>;
    std::vector<long> out;
    for (index_t i = 0; i < v.extents[0]; ++i)
      for (index_t j = 0; j < v.extents[1]; ++j)
        for (index_t l = 0; l < v.extents[2]; ++l) {
          const char* e = reinterpret_cast<const char*>(&v(i, j, l));
          for (std::size_t c = 0; c < sizeof(T); ++c) out.push_back(e - base + long(c));
        }
    std::sort(out.begin(), out.end());
    return out;
  };
  auto share = [](const std::vector<long>& x, const std::vector<long>& y) {
    std::vector<long> both;
    std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
    return !both.empty();
  };
  std::uint64_t seed = 88172645463325252ull;
  auto next = [&](int n) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return static_cast<index_t>(seed % static_cast<std::uint64_t>(n));
  };
  auto random_view = [&](auto* data, index_t shift) {
    using T = std::remove_pointer_t<decltype(data)>;
    alibi::tensor_view<T, 3> v;
    index_t low = 0;
    for (int d = 0; d < 3; ++d) {
      v.extents[d] = 1 + next(4);
      v.strides[d] = next(23) - shift;
      low += std::min<index_t>(0, v.strides[d] * (v.extents[d] - 1));
    }
    v.data = data - low + next(48);
    return v;
  };
  int shared = 0, agree = 0;
  const int cases = 4000;
  for (int c = 0; c < cases; ++c) {
    const auto a = random_view(buf.data() + 500, 3);
    const auto b = random_view(buf.data() + 500, 5);
    const auto h = random_view(reinterpret_cast<std::int16_t*>(buf.data() + 500), 4);
    const auto ba = bytes_of(a), bb = bytes_of(b), bh = bytes_of(h);
    agree += alibi::detail::views_share_bytes(a, b) == share(ba, bb);
    agree += alibi::detail::views_share_bytes(a, h) == share(ba, bh);
    shared += share(ba, bb);
  }
  CHECK(agree == 2 * cases);
  // The stride of an extent-1 dimension is never used, whatever it is (no arithmetic on it:
  // UBSan would see the overflow).
  const auto odd = alibi::make_strided_view<float, 2>(buf.data() + 8, {1, 4},
                                                      {std::numeric_limits<index_t>::min(), 1});
  const auto row = alibi::make_strided_view<float, 2>(buf.data(), {2, 8}, {8, 1});
  CHECK(alibi::detail::views_share_bytes(odd, row));
  CHECK(alibi::detail::views_share_bytes(row, odd));
  CHECK_FALSE(alibi::detail::views_share_bytes(odd, alibi::make_view(buf.data(), 1, 8)));
  // Both answers occur often enough for the comparison to mean something.
  CHECK(shared > cases / 10);
  CHECK(shared < cases * 9 / 10);
}

TEST_CASE("caller slopes must be present and have q_heads entries", "[validation]") {
  const alibi::backend::reference ref{};
  fixture f;  // 4 query heads, batch 2
  const std::vector<float> s(8, 0.25f);
  alibi::attention_params p;
  p.slopes = alibi::slope_config::per_head(nullptr, 4);
  REQUIRE_THAT(message_of(ref, f, p), Contains("params.slopes.values"));
  p.slopes = alibi::slope_config::per_batch_head(nullptr, 2, 4);
  REQUIRE_THAT(message_of(ref, f, p), Contains("params.slopes.values"));
  p.slopes = alibi::slope_config::per_head(s.data(), 7);
  REQUIRE_THAT(message_of(ref, f, p), Contains("params.slopes.values"));
  p.slopes = alibi::slope_config::per_head(s.data(), 4);
  REQUIRE(message_of(ref, f, p) == "ok");
  p.slopes = alibi::slope_config::per_batch_head(s.data(), 2, 4);
  REQUIRE(message_of(ref, f, p) == "ok");
}

TEST_CASE("caller slopes must be finite", "[validation]") {
  // An infinite or NaN slope would make every output of its head NaN.
  fixture f;  // 4 query heads, batch 2
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> s(8, 0.25f);
    s[6] = bad;
    alibi::attention_params p;
    p.slopes = alibi::slope_config::per_batch_head(s.data(), 2, 4);
    for (const std::string& m :
         {message_of(alibi::backend::reference{}, f, p), message_of(alibi::backend::eigen{}, f, p)})
      REQUIRE_THAT(m, Contains("params.slopes.values must be finite") && Contains("(1, 2)"));
  }
}

TEST_CASE("slopes and scales past 2^64 are refused; up to it the output is finite",
          "[validation]") {
  // The kernels form scale * log2(e) and slope * log2(e) * distance in fp32: past 2^64 these
  // may overflow, and 0 * inf (a zero query, the nearest key) made every row NaN.
  fixture f;  // 4 query heads, batch 2; a zero query
  std::fill(f.qb.begin(), f.qb.end(), 0.0f);
  auto finite_output = [&](const alibi::attention_params& p) {
    alibi::attention(alibi::backend::eigen{1}, f.q, f.k, f.v, f.out, p);
    for (index_t i = 0; i < f.out.size(); ++i)
      if (!std::isfinite(f.ob[static_cast<std::size_t>(i)])) return false;
    return true;
  };
  const float edge = 0x1p64f, past = 3e38f;
  for (const float m : {edge, -edge, past, -past}) {
    std::vector<float> s(4, 0.25f);
    s[3] = m;
    alibi::attention_params p;
    p.slopes = alibi::slope_config::per_head(s.data(), 4);
    if (std::fabs(m) <= edge) {
      REQUIRE(finite_output(p));
    } else {
      for (const std::string& msg : {message_of(alibi::backend::reference{}, f, p),
                                     message_of(alibi::backend::eigen{}, f, p)})
        REQUIRE_THAT(msg, Contains("params.slopes.values must be finite and at most 2^64"));
    }
  }
  alibi::attention_params p;
  p.slopes.max_bias = -64.0f;  // 4 heads: 2^16, 2^32, 2^48, 2^64
  REQUIRE(finite_output(p));
  p.slopes.max_bias = -127.0f;  // head 2: 2^95, past the bound (head 3: 2^127, finite)
  REQUIRE_THAT(message_of(alibi::backend::eigen{}, f, p),
               Contains("params.slopes.max_bias = -127") && Contains("head 2"));
  p.slopes.max_bias = -1.0f;
  p.slopes.scale = 3e38f;
  REQUIRE_THAT(message_of(alibi::backend::eigen{}, f, p), Contains("params.slopes.scale"));
  p.slopes.enabled = false;  // no slopes: nothing to bound
  REQUIRE(message_of(alibi::backend::eigen{}, f, p) == "ok");
  alibi::attention_params q;
  q.scale = edge;
  REQUIRE(finite_output(q));
  q.scale = -past;
  REQUIRE_THAT(message_of(alibi::backend::eigen{}, f, q),
               Contains("params.scale must be finite and at most 2^64"));
  REQUIRE_THROWS_WITH(alibi::slopes(8, -200.0f), Contains("beyond float's range"));
}

TEST_CASE("every throw goes through one noreturn function", "[validation]") {
  REQUIRE_THROWS_WITH(alibi::detail::raise(alibi::argument_error("alibi::x: y")), "alibi::x: y");
  REQUIRE_THROWS_AS(alibi::detail::raise(alibi::argument_error("z")), alibi::error);
  REQUIRE_THROWS_AS(alibi::slopes_slice(-1, 0, 0), alibi::error);
}

TEST_CASE("device-side lengths are clamped to the tensor extents", "[validation]") {
  alibi::detail::attention_problem p;
  p.batch = 4;
  p.q_len = 4;
  p.k_len = 6;
  const index_t kl[] = {9, -2, 5, 6}, ql[] = {-1, 4, 7, 2};
  p.k_lengths = alibi::make_view(kl, 4);
  p.q_lengths = alibi::make_view(ql, 4);
  REQUIRE(p.len_k(0) == 6);
  REQUIRE(p.len_k(1) == 0);
  REQUIRE(p.len_k(2) == 5);
  REQUIRE(p.len_k(3) == 6);
  REQUIRE(p.len_q(0) == 0);
  REQUIRE(p.len_q(1) == 4);
  REQUIRE(p.len_q(2) == 4);
  REQUIRE(p.len_q(3) == 2);
  // On the host the raw values are still an error, not a silent clamp.
  fixture f;  // batch 2, q_len 5, k_len 7
  const index_t bad_k[] = {9, 3}, bad_q[] = {2, -1};
  alibi::attention_params a;
  a.k_lengths = alibi::make_view(bad_k, 2);
  REQUIRE_THAT(message_of(alibi::backend::reference{}, f, a),
               Contains("params.k_lengths(0)") && Contains("got 9"));
  a = {};
  a.q_lengths = alibi::make_view(bad_q, 2);
  REQUIRE_THAT(message_of(alibi::backend::eigen{1}, f, a),
               Contains("params.q_lengths(1)") && Contains("got -1"));
}

TEST_CASE("offset errors name q_offsets or k_offsets", "[validation]") {
  fixture f;
  const index_t ok[] = {0, 0}, bad[] = {0, index_t(1) << 61};
  alibi::attention_params p;
  p.q_offsets = alibi::make_view(bad, 2);
  p.k_offsets = alibi::make_view(ok, 2);
  REQUIRE_THAT(message_of(alibi::backend::reference{}, f, p), Contains("params.q_offsets(1)"));
  p.q_offsets = alibi::make_view(ok, 2);
  p.k_offsets = alibi::make_view(bad, 2);
  REQUIRE_THAT(message_of(alibi::backend::reference{}, f, p), Contains("params.k_offsets(1)"));
}
