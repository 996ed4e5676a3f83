// SPDX-License-Identifier: MIT
// A downstream program using the safetensors component of an installed alibi: a file
// written in memory, parsed back and converted to float.
#include <cstdio>
#include <vector>

#include <alibi/io/safetensors.hpp>

int main() {
  alibi::safetensors_writer w;
  w.add("w", {2, 2}, std::vector<float>{1, 2, 3, 4});
  const auto file = alibi::safetensors::parse(w.bytes(), "consumer");
  const std::vector<float> w2 = file.to_float("w");
  std::printf("alibi safetensors consumer: w = %g %g %g %g\n", w2[0], w2[1], w2[2], w2[3]);
  return w2 == std::vector<float>{1, 2, 3, 4} ? 0 : 1;
}
