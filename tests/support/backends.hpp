// SPDX-License-Identifier: MIT
// The backends every shared test runs on, with the thread counts they are tested at. Each is
// also a runner of the shared edge-case bodies (edge_cases.hpp): it runs a host_call on the
// host views as they are.
#pragma once

#include <alibi/alibi.hpp>

#include "common.hpp"

namespace alibi_test {

/// The runner side of a host backend (edge_cases.hpp): alibi::attention on the call's host
/// views directly. The host backends take every head dim and any v_head_dim.
template <class Backend>
struct host_runner {
  static constexpr bool on_device = false;
  static bool supports_head_dim(index_t /*d*/, index_t /*dv*/) { return true; }
  /// The head dim a case that asks for `d` runs at: `d` itself.
  static index_t head_dim(index_t d) { return d; }
  static void attention(const host_call& c) {
    alibi::attention(Backend::make(), c.q, c.k, c.v, c.out, c.params);
  }
};

struct eigen_1thread : host_runner<eigen_1thread> {
  static alibi::backend::eigen make() { return alibi::backend::eigen{1}; }
  static constexpr const char* name = "eigen(1 thread)";
};
struct eigen_2threads : host_runner<eigen_2threads> {
  static alibi::backend::eigen make() { return alibi::backend::eigen{2}; }
  static constexpr const char* name = "eigen(2 threads)";
};
struct reference_backend : host_runner<reference_backend> {
  static alibi::backend::reference make() { return {}; }
  static constexpr const char* name = "reference";
};

}  // namespace alibi_test
