// SPDX-License-Identifier: MIT
// The replaceable global allocation functions, counting and optionally failing (see
// failing_new.hpp). Sized, aligned and nothrow forms all go through `counted`, so a program
// that links this file sees every operator new of the standard library and of alibi.
#include "failing_new.hpp"

#include <atomic>
#include <cstddef>
#include <cstdlib>

namespace {

std::atomic<std::int64_t> allocation_count{0};
// The allocation number that fails, or -1; reset to -1 by the allocation that fails.
std::atomic<std::int64_t> fail_at{-1};
std::atomic<bool> failed{false};

void* counted(std::size_t size, std::size_t alignment) {
  const std::int64_t n = allocation_count.fetch_add(1, std::memory_order_relaxed);
  std::int64_t planned = fail_at.load(std::memory_order_relaxed);
  if (planned == n && fail_at.compare_exchange_strong(planned, -1)) {
    failed.store(true);
    return nullptr;
  }
  if (size == 0) size = 1;
  if (alignment <= alignof(std::max_align_t)) return std::malloc(size);
  // aligned_alloc wants a size that is a multiple of the alignment.
  return std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
}

void* throwing(std::size_t size, std::size_t alignment) {
  void* p = counted(size, alignment);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

namespace alibi_test {

std::int64_t allocations() { return allocation_count.load(); }

fail_allocation::fail_allocation(std::int64_t n) {
  failed.store(false);
  fail_at.store(allocation_count.load() + n);
}

fail_allocation::~fail_allocation() { fail_at.store(-1); }

bool fail_allocation::fired() const { return failed.load(); }

}  // namespace alibi_test

void* operator new(std::size_t size) { return throwing(size, 0); }
void* operator new[](std::size_t size) { return throwing(size, 0); }
void* operator new(std::size_t size, std::align_val_t al) {
  return throwing(size, static_cast<std::size_t>(al));
}
void* operator new[](std::size_t size, std::align_val_t al) {
  return throwing(size, static_cast<std::size_t>(al));
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted(size, 0); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted(size, 0); }
void* operator new(std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted(size, static_cast<std::size_t>(al));
}
void* operator new[](std::size_t size, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted(size, static_cast<std::size_t>(al));
}

void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
