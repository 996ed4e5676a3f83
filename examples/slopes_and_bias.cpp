// SPDX-License-Identifier: MIT
// Slopes for a few head counts (including non-powers of two, where the paper interleaves)
// and the corner of a causal bias matrix, checked against the closed form.
#include <cmath>
#include <cstdio>

#include <alibi/alibi.hpp>

int main() {
  int bad = 0;
  for (int h : {8, 12}) {
    const auto s = alibi::slopes(h);
    std::printf("slopes(%d):", h);
    for (float x : s) std::printf(" %.6g", x);
    std::printf("\n");
    bad += s[0] != std::exp2(-8.0f / static_cast<float>(h == 12 ? 8 : h));
  }
  // Tensor parallelism: heads 4..7 of a 12-head model on the second of three devices.
  const auto slice = alibi::slopes_slice(12, 4, 4);
  std::printf("slopes_slice(12 heads, 4..7):");
  for (float x : slice) std::printf(" %.6g", x);
  std::printf("\n");
  bad += slice[0] != alibi::slopes(12)[4];

  alibi::attention_params params;
  params.mask.causal = true;
  const auto bias = alibi::bias_matrix(4, 6, 6, params);  // (heads, q_len, k_len)
  std::printf("causal bias, head 0 (slope %g), 6 x 6:\n", alibi::slope(0, 4));
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) std::printf(" %8.3f", bias(0, i, j) + 0.0f);  // + 0: print -0 as 0
    std::printf("\n");
    for (int j = 0; j <= i; ++j)
      bad += bias(0, i, j) != -alibi::slope(0, 4) * static_cast<float>(i - j);
    for (int j = i + 1; j < 6; ++j) bad += !std::isinf(bias(0, i, j));
  }
  std::printf(bad == 0 ? "slopes_and_bias: ok\n" : "slopes_and_bias: %d mismatches\n", bad);
  return bad == 0 ? 0 : 1;
}
