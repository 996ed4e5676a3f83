// SPDX-License-Identifier: MIT
// The host thread pool (backend/host/parallel.hpp): exceptions reach the caller, one shared pool
// serves every thread count.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>
#include <alibi/backend/host/parallel.hpp>

#include "live_threads.hpp"

using alibi::index_t;

TEST_CASE("parallel_for carries exceptions to the caller", "[pool]") {
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
                                        throw alibi::argument_error("item failed");
                                    }),
        alibi::error);
    REQUIRE(ran.load() < 400);  // no further items after the failure (a few may be in flight)
    // The pool still works afterwards.
    std::vector<int> seen(1000, 0);
    alibi::detail::parallel_for(threads, 1000, [&](index_t i) { seen[std::size_t(i)] += 1; });
    REQUIRE(std::count(seen.begin(), seen.end(), 1) == 1000);
  }
}

TEST_CASE("one shared pool for every thread count", "[pool]") {
  const int before = alibi::detail::pool_threads();
  const int most = alibi::backend::eigen::max_threads();
  for (int threads = 2; threads <= most; ++threads)
    alibi::detail::parallel_for(threads, 64, [](index_t) {});
  const int pool = alibi::detail::pool_threads();
  REQUIRE(pool == std::max(before, most - 1));
  const int live = alibi_test::live_threads();
  if (live >= 0) REQUIRE(live <= 1 + pool + 2);  // this thread, the pool, a little slack
}

TEST_CASE("a thread count beyond 4 x the hardware threads is refused, naming it", "[pool]") {
  const int most = alibi::backend::eigen::max_threads();
  std::vector<float> x(64, 1.0f), y(64);
  const auto q = alibi::make_view<const float>(x.data(), 1, 1, 4, 16);
  const auto out = alibi::make_view(y.data(), 1, 1, 4, 16);
  for (const int threads : {most + 1, 16400, std::numeric_limits<int>::max()})
    REQUIRE_THROWS_WITH(
        alibi::attention(alibi::backend::eigen{threads}, q, q, q, out),
        Catch::Contains("alibi::backend::eigen: threads must be at most " + std::to_string(most)));
  REQUIRE_NOTHROW(alibi::attention(alibi::backend::eigen{most}, q, q, q, out));
  REQUIRE(alibi::detail::pool_threads() <= most - 1);
}

TEST_CASE("a pool's threads end with it", "[pool]") {
  const int before = alibi_test::live_threads();
  {
    alibi::detail::worker_pool pool;
    REQUIRE(pool.grow(3) == 3);
    std::vector<int> seen(500, 0);
    alibi::detail::parallel_for(pool, 4, 500, [&](index_t i) { seen[std::size_t(i)] += 1; });
    REQUIRE(std::count(seen.begin(), seen.end(), 1) == 500);
    if (before >= 0) REQUIRE(alibi_test::live_threads() == before + 3);
  }
  if (before >= 0) REQUIRE(alibi_test::live_threads_settled(before) == before);
}
