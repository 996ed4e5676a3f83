// SPDX-License-Identifier: MIT
// Bad input gets an alibi::error naming the argument and what was expected, from
// attention() and, without throwing, from can_implement().
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
