// SPDX-License-Identifier: MIT
// Bad input to the public API surfaces as alibi::error naming the argument, never as another
// standard exception (std::out_of_range from a .at(), std::length_error or std::bad_alloc
// from a size that cannot exist).
#include <catch2/catch.hpp>

#include <cstdint>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/io/safetensors.hpp>

namespace {

using alibi::index_t;
using Catch::Contains;

/// "alibi::error: <message>", or the other exception's type and message, or "no exception".
template <class F>
std::string outcome(F&& f) {
  try {
    f();
  } catch (const alibi::error& e) {
    return std::string("alibi::error: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other exception (") + typeid(e).name() + "): " + e.what();
  }
  return "no exception";
}

}  // namespace

TEST_CASE("sizes that cannot exist are alibi::error", "[errors]") {
  constexpr index_t huge = std::numeric_limits<index_t>::max();
  CHECK_THAT(outcome([&] { alibi::slopes(huge); }),
             Catch::StartsWith("alibi::error: alibi::slopes_slice: count"));
  CHECK_THAT(outcome([&] { alibi::slopes_slice(huge, 1, huge - 1); }),
             Catch::StartsWith("alibi::error: alibi::slopes_slice: count"));
  const index_t big = index_t{1} << 21;  // big^3 floats: 2^65 bytes
  CHECK_THAT(outcome([&] { alibi::bias_matrix(big, big, big); }),
             Catch::StartsWith("alibi::error: alibi::bias_matrix: heads * q_len * k_len"));
}

// length, clear and truncate used std::vector::at: a bad b was std::out_of_range.
TEST_CASE("kv_cache sequence indices are checked as arguments", "[errors]") {
  using cpu = alibi::backend::eigen;
  alibi::kv_cache<float, cpu> cache(cpu{1}, 2, 8, 1, 4);
  for (const index_t b : {index_t{-1}, index_t{2}}) {
    CAPTURE(b);
    CHECK_THAT(outcome([&] { static_cast<void>(cache.length(b)); }),
               Catch::StartsWith("alibi::error: alibi::kv_cache::length: b"));
    CHECK_THAT(outcome([&] { cache.clear(b); }),
               Catch::StartsWith("alibi::error: alibi::kv_cache::clear: b"));
    CHECK_THAT(outcome([&] { cache.truncate(b, 0); }),
               Catch::StartsWith("alibi::error: alibi::kv_cache::truncate: b"));
  }
}

TEST_CASE("kv_cache sizes whose products overflow are alibi::error", "[errors]") {
  using cpu = alibi::backend::eigen;
  const index_t big = index_t(1) << 62;
  REQUIRE_THROWS_AS((alibi::kv_cache<float, cpu>(cpu{1}, 3, big, 1, 1)), alibi::error);
  REQUIRE_THROWS_WITH((alibi::kv_cache<float, cpu>(cpu{1}, 3, big, 1, 1)), Contains("capacity"));
  // kv_heads * head_dim alone wraps to 0 (no allocation at all before the fix).
  REQUIRE_THROWS_AS((alibi::kv_cache<float, cpu>(cpu{1}, 1, 1, index_t(1) << 32, index_t(1) << 32)),
                    alibi::error);
  // The element count fits in int64 but its bytes do not.
  REQUIRE_THROWS_WITH((alibi::kv_cache<float, cpu>(cpu{1}, 1, index_t(1) << 62, 1, 1)),
                      Contains("capacity"));
  REQUIRE_NOTHROW(alibi::kv_cache<float, cpu>(cpu{1}, 2, 16, 2, 8));
}

TEST_CASE("errors: one alibi::error base, each kind in its standard category", "[errors]") {
  using alibi::backend::eigen;
  // An invalid argument: alibi::argument_error, a std::invalid_argument.
  std::vector<float> x(64);
  auto bad_call = [&] {
    alibi::attention(eigen{}, alibi::make_view<const float>(x.data(), 1, 1, 4, 16),
                     alibi::make_view<const float>(x.data(), 1, 1, 4, 8),
                     alibi::make_view<const float>(x.data(), 1, 1, 4, 16),
                     alibi::make_view(x.data(), 1, 1, 4, 16));
  };
  CHECK_THROWS_AS(bad_call(), alibi::argument_error);
  CHECK_THROWS_AS(bad_call(), alibi::error);
  CHECK_THROWS_AS(bad_call(), std::invalid_argument);
  // A file whose contents are not a safetensors file: alibi::io_error, a std::runtime_error.
  auto corrupt = [] { alibi::safetensors::parse(std::vector<unsigned char>{1, 2, 3}); };
  CHECK_THROWS_AS(corrupt(), alibi::io_error);
  CHECK_THROWS_AS(corrupt(), alibi::error);
  CHECK_THROWS_AS(corrupt(), std::runtime_error);
  CHECK_THROWS_AS(alibi::safetensors::read("/nonexistent/alibi.safetensors"), std::runtime_error);
  // A full KV cache: alibi::capacity_error, a std::runtime_error.
  alibi::mha_config c;
  c.embed_dim = 8;
  c.q_heads = 2;
  alibi::multi_head_attention<float, eigen> m(c);
  auto cache = alibi::kv_cache<float, eigen>::for_module(m, 1, 2);
  std::vector<float> in(3 * 8, 0.5f), out(in.size());
  auto overfill = [&] {
    m.forward(alibi::make_view<const float>(in.data(), 1, 3, 8),
              alibi::make_view(out.data(), 1, 3, 8), cache);
  };
  CHECK_THROWS_AS(overfill(), alibi::capacity_error);
  CHECK_THROWS_AS(overfill(), alibi::error);
  CHECK_THROWS_AS(overfill(), std::runtime_error);
  // Every kind is a std::exception exactly once (a catch of std::exception sees each).
  CHECK_THROWS_AS(corrupt(), std::exception);
  CHECK_THROWS_AS(overfill(), std::exception);
  CHECK_THROWS_AS(bad_call(), std::exception);
}
