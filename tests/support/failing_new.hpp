// SPDX-License-Identifier: MIT
// Fault injection for the tests: a replacement of the global operator new (failing_new.cpp,
// linked into a test program) that counts allocations and can make the n-th one fail with
// std::bad_alloc. Counts every thread's allocations while armed.
#pragma once

#include <cstdint>
#include <new>

namespace alibi_test {

/// Allocations through the global operator new since the program started (every thread).
std::int64_t allocations();

/// While alive, the allocation `n` allocations from now (0: the next one) throws
/// std::bad_alloc; at most one allocation fails per scope. Not nested.
class fail_allocation {
 public:
  explicit fail_allocation(std::int64_t n);
  ~fail_allocation();
  fail_allocation(const fail_allocation&) = delete;
  fail_allocation& operator=(const fail_allocation&) = delete;
  /// Whether the planned allocation was reached (and failed).
  bool fired() const;
};

/// Calls f once and returns how many allocations it made.
template <class F>
std::int64_t count_allocations(F&& f) {
  const std::int64_t before = allocations();
  f();
  return allocations() - before;
}

/// The result of one injected failure: whether the n-th allocation was reached, and
/// whether f then threw (any exception).
struct injection {
  bool fired = false;
  bool threw = false;
};

/// Calls f with its n-th allocation failing (n counted from the call).
template <class F>
injection with_failed_allocation(std::int64_t n, F&& f) {
  injection r;
  {
    const fail_allocation fail(n);
    try {
      f();
    } catch (...) {
      r.threw = true;
    }
    r.fired = fail.fired();
  }
  return r;
}

}  // namespace alibi_test
