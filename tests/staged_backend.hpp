// SPDX-License-Identifier: MIT
// A test backend for alibi::mpi's host staging on machines without a GPU: the eigen backend's
// arithmetic, but a memory space other than the host's, so that the MPI functions take the
// path they take for backend::cuda: the tensors copied between host buffers and "the
// backend's memory" with layer_ops::stage_rows, the planning on host copies, the fences.
// Here both memories are the host's; stage_rows copies and counts its calls, and every copy
// checks that its two sides do not overlap (a staging copy never works in place).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <alibi/alibi.hpp>

struct staged_eigen : alibi::backend::eigen {
  using memory_space = alibi::device_space;
};

namespace alibi {
namespace detail {

template <>
struct attention_impl<staged_eigen> : attention_impl<backend::eigen> {};

template <>
struct layer_ops<staged_eigen> : layer_ops<backend::eigen> {
  static inline long long staged_copies = 0;

  template <class T>
  static void stage_rows(const staged_eigen&, const T* src, index_t lds, T* dst, index_t ldd,
                         index_t rows, index_t cols) {
    if (rows <= 0 || cols <= 0) return;
    ++staged_copies;
    for (index_t r = 0; r < rows; ++r) {
      const T* s = src + r * lds;
      T* d = dst + r * ldd;
      if (s < d + cols && d < s + cols) {
        std::fprintf(stderr, "staged_eigen::stage_rows: overlapping copy\n");
        std::abort();
      }
      std::memcpy(d, s, static_cast<std::size_t>(cols) * sizeof(T));
    }
  }
};

}  // namespace detail
}  // namespace alibi
