// SPDX-License-Identifier: MIT
// A test backend for alibi::mpi's host staging on machines without a GPU: the eigen backend's
// arithmetic, but a memory space other than the host's, so that the MPI functions take the
// path they take for backend::cuda: the tensors copied between host buffers and "the
// backend's memory" with layer_ops::stage_rows, the planning on host copies, the fences.
// Both memories are the host's here, so the copies behave as a stream's would:
// - stage_rows reads its source when called (after the copies queued before it), but writes
//   its destination only when the queue is flushed: at fence(), or before the next device
//   operation (attention, merge, zero_rows, the next copy). A host read of copied rows
//   without a fence sees the old values, and the tests fail;
// - every copy checks that its two sides do not overlap;
// - `fail_at` makes the copy with that number throw a std::runtime_error (not an
//   alibi::error, as CUDA's errors are not), and `fail_op_at` the device operation (attention,
//   merge, zero_rows, and the layers' linear, norms and multiply) with that number, to test
//   that a failure on one rank becomes an error on every rank.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include <alibi/alibi.hpp>

struct staged_eigen : alibi::backend::eigen {
  using memory_space = alibi::device_space;
};

namespace alibi {
namespace detail {

template <>
struct layer_ops<staged_eigen> : layer_ops<backend::eigen> {
  using base = layer_ops<backend::eigen>;
  static inline long long staged_copies = 0;  // copies made so far
  static inline long long fail_at = -1;       // the copy number that throws, or -1
  static inline long long device_ops = 0;     // device operations (see above) so far
  static inline long long fail_op_at = -1;    // the operation number that throws, or -1
  static inline std::vector<std::function<void()>> pending;  // queued destination writes

  static void flush() {
    for (const auto& write : pending) write();
    pending.clear();
  }
  /// A device operation begins: the queued copies first; maybe the injected failure.
  static void device_op() {
    flush();
    if (++device_ops == fail_op_at) {
      fail_op_at = -1;
      throw std::runtime_error("staged_eigen: injected operation failure");
    }
  }

  template <class T>
  static void stage_rows(const staged_eigen&, const T* src, index_t lds, T* dst, index_t ldd,
                         index_t rows, index_t cols) {
    if (rows <= 0 || cols <= 0) return;
    flush();  // the copies and operations queued before this one have happened
    if (++staged_copies == fail_at) {
      fail_at = -1;
      throw std::runtime_error("staged_eigen: injected copy failure");
    }
    const std::size_t row_bytes = static_cast<std::size_t>(cols) * sizeof(T);
    std::vector<unsigned char> data(static_cast<std::size_t>(rows) * row_bytes);
    for (index_t r = 0; r < rows; ++r) {
      const T* s = src + r * lds;
      T* d = dst + r * ldd;
      if (s < d + cols && d < s + cols) {
        std::fprintf(stderr, "staged_eigen::stage_rows: overlapping copy\n");
        std::abort();
      }
      std::memcpy(data.data() + static_cast<std::size_t>(r) * row_bytes, s, row_bytes);
    }
    pending.push_back([data = std::move(data), dst, ldd, rows, row_bytes] {
      for (index_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * ldd, data.data() + static_cast<std::size_t>(r) * row_bytes,
                    row_bytes);
    });
  }
  static void fence(const staged_eigen&) { flush(); }
  template <class T>
  static void zero_rows(const staged_eigen& be, T* dst, index_t ld, index_t rows, index_t cols) {
    device_op();
    base::zero_rows(be, dst, ld, rows, cols);
  }
  template <class... A>
  static void linear(const staged_eigen& be, const A&... a) {
    device_op();
    base::linear(be, a...);
  }
  template <class... A>
  static void layer_norm(const staged_eigen& be, const A&... a) {
    device_op();
    base::layer_norm(be, a...);
  }
  template <class... A>
  static void rms_norm(const staged_eigen& be, const A&... a) {
    device_op();
    base::rms_norm(be, a...);
  }
  template <class... A>
  static void multiply(const staged_eigen& be, const A&... a) {
    device_op();
    base::multiply(be, a...);
  }
};

template <>
struct attention_impl<staged_eigen> : attention_impl<backend::eigen> {
  using base = attention_impl<backend::eigen>;
  template <class... A>
  static void run(const staged_eigen& be, const A&... a) {
    layer_ops<staged_eigen>::device_op();
    base::run(be, a...);
  }
  template <class T>
  static void merge(const staged_eigen& be, const partial_merge_args<T>& a) {
    layer_ops<staged_eigen>::device_op();
    base::merge(be, a);
  }
};

}  // namespace detail
}  // namespace alibi
