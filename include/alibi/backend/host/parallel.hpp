// SPDX-License-Identifier: MIT
// Work distribution for the CPU backend: persistent worker threads plus the calling thread
// pull work items from one atomic counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "alibi/core/backends.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {

/// The number of threads a backend's `threads` field asks for (<= 0: all hardware threads).
inline int resolve_threads(int threads) {
  threads_status(threads).throw_if_failed();
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

/// The process-wide worker threads of the CPU backend: one set, grown when a call asks for
/// more helpers than it has, shared by every calling thread.
///
/// A call hands the pool a `job` (on the caller's stack) that wants some helpers; idle
/// workers take it up, each running the job's `run` once. The caller works on the job
/// itself, then withdraws it: helpers that have not taken it by then never will, and the
/// caller waits only for those that have. So a call never waits for a thread that could not
/// start or is busy with another call, and nothing on this path allocates.
///
/// Why not Eigen::ThreadPool (used before): its constructor cannot survive a thread that
/// fails to start (under a process thread limit it hangs or uses freed memory), and its
/// caller waits for every scheduled task, so a smaller pool than asked for would deadlock.
class worker_pool {
 public:
  struct job {
    void (*run)(job&) noexcept = nullptr;
    job* next = nullptr;
    index_t wanted = 0;   // helpers still wanted while queued (guarded by the pool's mutex)
    index_t running = 0;  // helpers that took it and have not finished (guarded)
    bool withdrawn = false;
    std::condition_variable finished;
  };

  /// The process's pool, started on first use and joined at exit. (Other instances serve
  /// tests; parallel_for takes one.) alibi::kernels' instruction-set variants keep their own
  /// copies of every inline function (CMakeLists.txt), but not of this one: they call the
  /// dispatcher's, so that a program has one pool whichever code calls it.
#if defined(ALIBI_KERNELS_VARIANT)
  static worker_pool& get();
#else
  static worker_pool& get() {
    static worker_pool pool;
    return pool;
  }
#endif
  worker_pool() = default;

  /// Starts workers until there are `workers` (or as many as the system allows: a thread
  /// that fails to start, or memory for it, leaves the pool as it is). Returns the count.
  int grow(int workers) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int>(threads_.size()) >= workers) return static_cast<int>(threads_.size());
#if defined(__cpp_exceptions)
    try {
      threads_.reserve(static_cast<std::size_t>(workers));
      while (static_cast<int>(threads_.size()) < workers) threads_.emplace_back([this] { work(); });
    } catch (...) {
      // std::system_error (no thread: a process limit) or std::bad_alloc: the workers that
      // started serve the calls; a later call tries again.
    }
#else
    threads_.reserve(static_cast<std::size_t>(workers));
    while (static_cast<int>(threads_.size()) < workers) threads_.emplace_back([this] { work(); });
#endif
    return static_cast<int>(threads_.size());
  }

  int size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(threads_.size());
  }

  /// Queues `j` for up to `helpers` workers.
  void submit(job& j, index_t helpers) {
    std::lock_guard<std::mutex> lock(mutex_);
    j.wanted = helpers;
    if (tail_)
      tail_->next = &j;
    else
      head_ = &j;
    tail_ = &j;
    queued_.fetch_add(1, std::memory_order_release);
    if (sleeping_ == 0) return;  // the spinning workers see queued_
    if (helpers == 1)
      work_cv_.notify_one();
    else
      work_cv_.notify_all();
  }

  /// Takes `j` off the queue if no worker has taken its last place, then waits until the
  /// workers that took it have returned from run. Afterwards no worker touches `j`.
  void withdraw(job& j) noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    if (j.wanted > 0) unlink(j);
    j.withdrawn = true;
    while (j.running > 0) j.finished.wait(lock);
  }

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  ~worker_pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void unlink(job& j) noexcept {
    job* prev = nullptr;
    for (job* it = head_; it; prev = it, it = it->next)
      if (it == &j) {
        (prev ? prev->next : head_) = j.next;
        if (tail_ == &j) tail_ = prev;
        j.next = nullptr;
        queued_.fetch_sub(1, std::memory_order_relaxed);
        return;
      }
  }

  // Takes a place in the first queued job (the caller holds the lock and head_ is set).
  job& take() noexcept {
    job& j = *head_;
    if (--j.wanted == 0) unlink(j);
    ++j.running;
    return j;
  }

  void work() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (!head_ && !stop_) {
        // Why spin first: consecutive short calls (decoding) would otherwise pay a wake-up
        // for every helper of every call. The spin is bounded in time (spin_us), so an idle
        // process stops using the CPU soon after its last call.
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
        while (queued_.load(std::memory_order_acquire) == 0 &&
               std::chrono::steady_clock::now() < until)
          std::this_thread::yield();
        lock.lock();
        ++sleeping_;
        work_cv_.wait(lock, [this] { return head_ != nullptr || stop_; });
        --sleeping_;
      }
      if (stop_) return;
      job& j = take();
      lock.unlock();
      j.run(j);
      lock.lock();
      if (--j.running == 0 && j.withdrawn) j.finished.notify_one();
    }
  }

  /// Microseconds an idle worker polls for work before it sleeps: the environment variable
  /// ALIBI_POOL_SPIN_US when set (0 to 10^7), else default_spin_us.
  static long spin_from_environment() {
    const char* text = std::getenv("ALIBI_POOL_SPIN_US");
    if (text == nullptr || *text == '\0') return default_spin_us;
    char* end = nullptr;
    errno = 0;
    const long us = std::strtol(text, &end, 10);
    if (*end != '\0' || errno != 0 || us < 0 || us > 10000000)
      detail::raise(argument_error(std::string("alibi: ALIBI_POOL_SPIN_US must be an integer of "
                                               "microseconds in [0, 10000000], got '") +
                                   text + "'"));
    return us;
  }
  static constexpr long default_spin_us = 1000;

  const long spin_us_ = spin_from_environment();

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::vector<std::thread> threads_;
  job* head_ = nullptr;
  job* tail_ = nullptr;
  std::atomic<int> queued_{0};
  int sleeping_ = 0;
  bool stop_ = false;
};

/// Worker threads of the process-wide pool (0 before the first parallel call).
inline int pool_threads() { return worker_pool::get().size(); }

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
/// depend on the thread count (the pool may have more threads than asked for; at most
/// `threads - 1` of them take part, fewer when the pool could not start that many or its
/// workers are busy with other calls).
///
/// Exceptions: the first exception f throws (on any thread) stops handing out further items;
/// the call waits for every helper that took part to finish, then rethrows it on the calling
/// thread. (Built
/// without exceptions, with ALIBI_THROW defined, there is nothing to catch.)
template <class F>
void parallel_for(worker_pool& pool, int threads, index_t count, F&& f) {
  const index_t helpers = std::min<index_t>(threads, count) - 1;
  if (helpers <= 0) {
    const single_threaded_products serial;
    for (index_t i = 0; i < count; ++i) f(i);
    return;
  }
  struct context : worker_pool::job {
    std::atomic<index_t> next_item{0};
    index_t count = 0;
    F* f = nullptr;
    std::mutex error_mutex;
    std::exception_ptr error;
    void drain() noexcept {
      const single_threaded_products serial;  // on the pool threads and the caller
#if defined(__cpp_exceptions)
      try {
        for (index_t i = next_item.fetch_add(1); i < count; i = next_item.fetch_add(1)) (*f)(i);
      } catch (...) {
        // Stop the others after their current item: no item starts once next_item >= count.
        next_item.store(count);
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
#else
      for (index_t i = next_item.fetch_add(1); i < count; i = next_item.fetch_add(1)) (*f)(i);
#endif
    }
  } ctx;
  ctx.count = count;
  ctx.f = &f;
  ctx.run = [](worker_pool::job& j) noexcept { static_cast<context&>(j).drain(); };
  // A pool smaller than asked for (threads that could not start) gives fewer helpers; the
  // caller does whatever they do not.
  const index_t started = std::min<index_t>(helpers, pool.grow(threads - 1));
  if (started > 0) pool.submit(ctx, started);
  ctx.drain();
  if (started > 0) pool.withdraw(ctx);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

/// parallel_for on the process's pool.
template <class F>
void parallel_for(int threads, index_t count, F&& f) {
  parallel_for(worker_pool::get(), threads, count, std::forward<F>(f));
}

}  // namespace ALIBI_CPU_ISA
}  // namespace detail
}  // namespace alibi
