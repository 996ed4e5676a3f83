// SPDX-License-Identifier: MIT
// A downstream program: builds against an installed or vendored alibi and checks one result.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <alibi/alibi.hpp>

int main() {
  // One query attending to two keys with equal scores: the 1-head slope is 1/256, so the
  // near key (distance 0) outweighs the far one (distance 1) by exp(1/256).
  std::vector<float> q(4, 0.0f), k(8, 0.0f), v = {1, 1, 1, 1, 3, 3, 3, 3}, out(4);
  alibi::attention(alibi::backend::eigen{1}, alibi::make_view(q.data(), 1, 1, 1, 4),
                   alibi::make_view(k.data(), 1, 1, 2, 4), alibi::make_view(v.data(), 1, 1, 2, 4),
                   alibi::make_view(out.data(), 1, 1, 1, 4));
  const double w = std::exp(-1.0 / 256);
  const double expect = (1 * w + 3) / (w + 1);
  std::printf("alibi %s consumer: out = %.7f (expected %.7f)\n", ALIBI_VERSION_STRING, out[0],
              expect);
#if defined(ALIBI_PRECOMPILED_KERNELS)
  std::printf("alibi::kernels variant that ran: %s (%s)\n", alibi::cpu_kernels_selected().name,
              alibi::cpu_kernels_selected().isa);
#endif
#ifdef ALIBI_CONSUMER_EXPECT_VERSION
  // The version the package was found with (CMake's alibi_VERSION).
  if (std::strcmp(ALIBI_VERSION_STRING, ALIBI_CONSUMER_EXPECT_VERSION) != 0) {
    std::printf("alibi/core/version.hpp says %s, the package says %s\n", ALIBI_VERSION_STRING,
                ALIBI_CONSUMER_EXPECT_VERSION);
    return 1;
  }
#endif
  return std::abs(out[0] - expect) < 1e-6 ? 0 : 1;
}
