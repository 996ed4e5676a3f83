// SPDX-License-Identifier: MIT
// alibi::merge_partials on the host backends: row by row with the shared state
// (detail::row_merge), parallel over (batch, head) on the eigen backend's threads.
#pragma once

#include <type_traits>

#include "alibi/backend/eigen/parallel.hpp"
#include "alibi/merge.hpp"

namespace alibi {
namespace detail {

template <class Backend>
struct partial_merge_impl<Backend,
                          std::enable_if_t<std::is_same<Backend, backend::eigen>::value ||
                                           std::is_same<Backend, backend::reference>::value>> {
  template <class T>
  static void run(const Backend& be, const partial_merge_args<T>& a) {
    int threads = 1;
    if constexpr (std::is_same<Backend, backend::eigen>::value)
      threads = resolve_threads(be.threads);
    const index_t B = a.out.extents[0], H = a.out.extents[1], L = a.out.extents[2];
    const index_t D = a.out.extents[3];
    parallel_for(threads, B * H, [&](index_t bh) {
      const index_t b = bh / H, h = bh % H;
      for (index_t i = 0; i < L; ++i) {
        const row_merge r = row_merge::make(a.lse_a(b, h, i), a.lse_b(b, h, i));
        for (index_t d = 0; d < D; ++d)
          a.out(b, h, i, d) = static_cast<T>(r.value(static_cast<float>(a.out_a(b, h, i, d)),
                                                     static_cast<float>(a.out_b(b, h, i, d))));
        if (a.lse.data) a.lse(b, h, i) = r.state.lse();
      }
    });
  }
};

}  // namespace detail
}  // namespace alibi
