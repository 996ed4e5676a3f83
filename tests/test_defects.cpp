// SPDX-License-Identifier: MIT
// Regression tests for defects found in review: each case failed (or crashed) before its fix.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>

#include <alibi/backend/host/parallel.hpp>
#include "call_fixture.hpp"

using alibi::index_t;
using Catch::Contains;

using fixture = alibi_test::call_fixture;
using alibi_test::message_of;

TEST_CASE("defects: zero query heads with zero kv heads is an empty problem", "[defects]") {
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

TEST_CASE("defects: kv_cache sizes whose products overflow are alibi::error", "[defects]") {
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

TEST_CASE("defects: element counts that overflow int64 are refused", "[defects]") {
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

TEST_CASE("defects: out and logsumexp must not overlap themselves", "[defects]") {
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

TEST_CASE("defects: parallel_for carries exceptions to the caller", "[defects]") {
  for (int threads = 2; threads <= 4; ++threads) {
    // Thrown on a worker thread (it used to escape into the pool: std::terminate).
    const std::thread::id caller = std::this_thread::get_id();
    REQUIRE_THROWS_AS(
        alibi::detail::parallel_for(threads, 400,
                                    [&](index_t) {
                                      if (std::this_thread::get_id() != caller)
                                        throw std::bad_alloc();
                                      std::this_thread::sleep_for(std::chrono::microseconds(200));
                                    }),
        std::bad_alloc);
    // Thrown on the calling thread (it used to free the context the workers still used).
    std::atomic<int> ran{0};
    REQUIRE_THROWS_AS(
        alibi::detail::parallel_for(threads, 400,
                                    [&](index_t) {
                                      ran.fetch_add(1);
                                      std::this_thread::sleep_for(std::chrono::microseconds(100));
                                      if (std::this_thread::get_id() == caller)
                                        throw alibi::error("item failed");
                                    }),
        alibi::error);
    REQUIRE(ran.load() < 400);  // no further items after the failure (a few may be in flight)
    // The pool still works afterwards.
    std::vector<int> seen(1000, 0);
    alibi::detail::parallel_for(threads, 1000, [&](index_t i) { seen[std::size_t(i)] += 1; });
    REQUIRE(std::count(seen.begin(), seen.end(), 1) == 1000);
  }
}

namespace {
int live_threads() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;  // not Linux: not measured
}
}  // namespace

TEST_CASE("defects: one shared pool for every thread count", "[defects]") {
  const int before = alibi::detail::pool_threads();
  for (int threads = 2; threads <= 16; ++threads)
    alibi::detail::parallel_for(threads, 64, [](index_t) {});
  const int pool = alibi::detail::pool_threads();
  REQUIRE(pool == std::max(before, 15));
  const int live = live_threads();
  if (live >= 0) REQUIRE(live <= 1 + pool + 2);  // this thread, the pool, a little slack
}

TEST_CASE("defects: safetensors byte sizes that wrap are refused", "[defects]") {
  using alibi::safetensors;
  const auto with_header = alibi_test::safetensors_bytes;
  // 2^31 * 2^31 elements * 4 bytes = 2^64 bytes, which wrapped to 0 = end - begin.
  REQUIRE_THROWS_WITH(
      safetensors::parse(
          with_header(
              R"({"w":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", 0),
          "huge.safetensors"),
      Contains("huge.safetensors") && Contains("tensor 'w'") && Contains("overflow"));
  REQUIRE_THROWS_AS(
      safetensors::parse(with_header(
          R"({"w":{"dtype":"F64","shape":[4,4611686018427387904],"data_offsets":[0,0]}})", 0)),
      alibi::error);
  // The writer's element count is checked too.
  alibi::safetensors_writer w;
  REQUIRE_THROWS_WITH(w.add("w", {index_t(1) << 32, index_t(1) << 32}, std::vector<float>{}),
                      Contains("tensor 'w'") && Contains("overflow"));
}

TEST_CASE("defects: caller slopes must be present and have q_heads entries", "[defects]") {
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

TEST_CASE("defects: every throw goes through one noreturn function", "[defects]") {
  REQUIRE_THROWS_WITH(alibi::detail::raise(alibi::error("alibi::x: y")), "alibi::x: y");
  REQUIRE_THROWS_AS(alibi::detail::raise(alibi::error("z")), alibi::error);
  REQUIRE_THROWS_AS(alibi::slopes_slice(-1, 0, 0), alibi::error);
}

TEST_CASE("defects: device-side lengths are clamped to the tensor extents", "[defects]") {
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

TEST_CASE("defects: offset errors name q_offsets or k_offsets", "[defects]") {
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
