// SPDX-License-Identifier: MIT
// Work distribution for the CPU backend: persistent Eigen::ThreadPool workers plus the
// calling thread pull work items from one atomic counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <unsupported/Eigen/CXX11/ThreadPool>

#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {

/// The number of threads a backend's `threads` field asks for (<= 0: all hardware threads).
inline int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

/// The process-wide worker pool: one pool, grown when a call asks for more workers than it
/// has (starting threads per call would cost more than a small attention call itself, and
/// one pool per thread count would keep every size ever asked for alive).
struct pool_registry {
  std::mutex mutex;
  std::shared_ptr<Eigen::ThreadPool> pool;
  static pool_registry& get() {
    static pool_registry r;
    return r;
  }
};

/// A pool with at least `workers` threads. A pool replaced by a bigger one lives on while a
/// call still holds it (the shared_ptr), and its threads end when the last holder releases it.
inline std::shared_ptr<Eigen::ThreadPool> shared_pool(int workers) {
  pool_registry& r = pool_registry::get();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.pool || r.pool->NumThreads() < workers)
    r.pool = std::make_shared<Eigen::ThreadPool>(workers);
  return r.pool;
}

/// Threads of the current process-wide pool (0 before the first parallel call).
inline int pool_threads() {
  pool_registry& r = pool_registry::get();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.pool ? r.pool->NumThreads() : 0;
}

// The code below differs with -fopenmp, so it lives in the inline namespace whose name says
// so (ALIBI_CPU_ISA): a program mixing OpenMP and non-OpenMP translation units keeps both.
inline namespace ALIBI_CPU_ISA {

/// While alive, Eigen's matrix products on this thread run single-threaded; the thread's
/// previous OpenMP setting comes back at the end of the scope.
///
/// Why: in a program built with -fopenmp, Eigen runs every large enough product with an
/// OpenMP team of Eigen::nbThreads() = omp_get_max_threads() threads unless the thread is
/// already in a team. alibi's pool threads are not OpenMP threads, so each would start a team
/// of its own: threads x OpenMP threads runnable at once, several times slower
/// (docs/journal/2026-12-design-measurements.md, "host/parallel.hpp: single_threaded_products"),
/// and Eigen's GEMM blocking, so the rounding of the results, would depend on the team size.
/// alibi's threading is the only one inside a call. omp_get_max_threads() reads nthreads-var,
/// an ICV of the current task: outside a parallel region each thread has its own, so setting
/// it here changes only this thread, for this scope (on the calling thread too, where the
/// user's value is restored). Eigen::setNbThreads(1) is not used: it is process-wide and
/// would change the user's own products, from any thread, while alibi runs.
/// Limit: a value the user set with Eigen::setNbThreads(n > 1) takes precedence over the ICV
/// in Eigen, so products in alibi's workers would start teams again; leave it unset and size
/// OpenMP with OMP_NUM_THREADS or omp_set_num_threads instead.
class single_threaded_products {
 public:
  single_threaded_products() noexcept {
#ifdef _OPENMP
    saved_ = omp_get_max_threads();
    if (saved_ != 1) omp_set_num_threads(1);
#endif
  }
  ~single_threaded_products() {
#ifdef _OPENMP
    if (saved_ != 1) omp_set_num_threads(saved_);
#endif
  }
  single_threaded_products(const single_threaded_products&) = delete;
  single_threaded_products& operator=(const single_threaded_products&) = delete;

#ifdef _OPENMP
 private:
  int saved_ = 1;
#endif
};

/// Calls f(item) for item in [0, count) on up to `threads` threads (the caller included).
/// Which thread runs an item never changes what the item computes, so results do not
/// depend on the thread count (the pool may have more threads than asked for; only
/// `threads - 1` of them are given work).
///
/// Exceptions: the first exception f throws (on any thread) stops handing out further items;
/// the call waits for every helper to finish, then rethrows it on the calling thread. (Built
/// without exceptions, with ALIBI_THROW defined, there is nothing to catch.)
template <class F>
void parallel_for(int threads, index_t count, F&& f) {
  const index_t helpers = std::min<index_t>(threads, count) - 1;
  if (helpers <= 0) {
    const single_threaded_products serial;
    for (index_t i = 0; i < count; ++i) f(i);
    return;
  }
  struct context {
    std::atomic<index_t> next{0};
    index_t count;
    F* f;
    std::mutex error_mutex;
    std::exception_ptr error;
    void drain() noexcept {
      const single_threaded_products serial;  // on the pool threads and the caller
#if defined(__cpp_exceptions)
      try {
        for (index_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) (*f)(i);
      } catch (...) {
        // Stop the others after their current item: no item starts once next >= count.
        next.store(count);
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
#else
      for (index_t i = next.fetch_add(1); i < count; i = next.fetch_add(1)) (*f)(i);
#endif
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
  // Held until every helper is done, even if the registry moves on to a bigger pool.
  const std::shared_ptr<Eigen::ThreadPool> pool = shared_pool(threads - 1);
  for (index_t w = 0; w < helpers; ++w) {
#if defined(__cpp_exceptions)
    try {
      pool->Schedule(task{&ctx, &done});
    } catch (...) {
      // Could not hand out a helper (out of memory): the ones scheduled finish without
      // items, the missing ones are counted as done, and the error reaches the caller.
      ctx.next.store(count);
      for (index_t m = w; m < helpers; ++m) done.Notify();
      done.Wait();
      throw;
    }
#else
    pool->Schedule(task{&ctx, &done});
#endif
  }
  ctx.drain();
  done.Wait();
  if (ctx.error) std::rethrow_exception(ctx.error);
}

}  // namespace ALIBI_CPU_ISA
}  // namespace detail
}  // namespace alibi
