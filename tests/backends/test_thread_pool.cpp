// SPDX-License-Identifier: MIT
// The host thread pool (backend/host/parallel.hpp): exceptions reach the caller, one shared pool
// serves every thread count.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>
#include <alibi/backend/host/parallel.hpp>

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

TEST_CASE("one shared pool for every thread count", "[pool]") {
  const int before = alibi::detail::pool_threads();
  for (int threads = 2; threads <= 16; ++threads)
    alibi::detail::parallel_for(threads, 64, [](index_t) {});
  const int pool = alibi::detail::pool_threads();
  REQUIRE(pool == std::max(before, 15));
  const int live = live_threads();
  if (live >= 0) REQUIRE(live <= 1 + pool + 2);  // this thread, the pool, a little slack
}
