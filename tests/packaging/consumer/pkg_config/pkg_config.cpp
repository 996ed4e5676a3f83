// SPDX-License-Identifier: MIT
// Compiled with nothing but `pkg-config --cflags alibi`: the installed headers and Eigen's.
#include <Eigen/Core>
#include <alibi/core/version.hpp>

constexpr bool same(const char* a, const char* b) {
  return *a == *b && (*a == '\0' || same(a + 1, b + 1));
}
static_assert(same(ALIBI_VERSION_STRING, EXPECT_VERSION),
              "the installed alibi/core/version.hpp must say the package's version");
static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0), "alibi needs Eigen 3.4");

int main() { return 0; }
