// SPDX-License-Identifier: MIT
// The backends every shared test runs on, with the thread counts they are tested at.
#pragma once

#include <alibi/alibi.hpp>

namespace alibi_test {

struct eigen_1thread {
  static alibi::backend::eigen make() { return alibi::backend::eigen{1}; }
  static constexpr const char* name = "eigen(1 thread)";
};
struct eigen_2threads {
  static alibi::backend::eigen make() { return alibi::backend::eigen{2}; }
  static constexpr const char* name = "eigen(2 threads)";
};
struct reference_backend {
  static alibi::backend::reference make() { return {}; }
  static constexpr const char* name = "reference";
};

}  // namespace alibi_test
