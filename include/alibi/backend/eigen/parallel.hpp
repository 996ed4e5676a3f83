// SPDX-License-Identifier: MIT
// Work distribution for the CPU backend: persistent Eigen::ThreadPool workers plus the
// calling thread pull work items from one atomic counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <unsupported/Eigen/CXX11/ThreadPool>

#include "alibi/tensor_view.hpp"

namespace alibi {
namespace detail {

/// The number of threads a backend's `threads` field asks for (<= 0: all hardware threads).
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

/// A process-wide pool of `workers` threads, created on first use and kept: starting threads
/// per call would cost more than a small attention call itself.
inline Eigen::ThreadPool& shared_pool(int workers) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Eigen::ThreadPool>> pools;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Eigen::ThreadPool>& pool = pools[workers];
  if (!pool) pool = std::make_unique<Eigen::ThreadPool>(workers);
  return *pool;
}

/// Calls f(item) for item in [0, count) on up to `threads` threads (the caller included).
/// Which thread runs an item never changes what the item computes, so results do not
/// depend on the thread count.
template <class F>
void parallel_for(int threads, index_t count, F&& f) {
  const index_t helpers = std::min<index_t>(threads, count) - 1;
  if (helpers <= 0) {
    for (index_t i = 0; i < count; ++i) f(i);
    return;
  }
  struct context {
    std::atomic<index_t> next{0};
    index_t count;
    F* f;
    void drain() {
      for (index_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) (*f)(i);
    }
  } ctx;
  ctx.count = count;
  ctx.f = &f;
  Eigen::Barrier done(static_cast<unsigned>(helpers));
  struct task {
    context* ctx;
    Eigen::Barrier* done;
    void operator()() const {
      ctx->drain();
      done->Notify();
    }
  };
  Eigen::ThreadPool& pool = shared_pool(threads - 1);
  for (index_t w = 0; w < helpers; ++w) pool.Schedule(task{&ctx, &done});
  ctx.drain();
  done.Wait();
}

}  // namespace detail
}  // namespace alibi
