// SPDX-License-Identifier: MIT
// A downstream program that got alibi through FetchContent. Kept to one cheap translation
// unit (the find_package and add_subdirectory consumers compile a full attention call): it
// checks that the alibi::alibi target brings alibi's headers and Eigen's, and one result.
#include <cmath>
#include <cstdio>
#include <vector>

#include <Eigen/Core>
#include <alibi/core/slopes.hpp>
#include <alibi/core/version.hpp>

int main() {
  // 8 heads, max_bias 8: the paper's slopes are 2^-1, 2^-2, ..., 2^-8.
  const std::vector<float> s = alibi::slopes(8);
  const Eigen::Map<const Eigen::VectorXf> got(s.data(), static_cast<Eigen::Index>(s.size()));
  Eigen::VectorXf expect(8);
  for (int h = 0; h < 8; ++h) expect[h] = std::ldexp(1.0f, -(h + 1));
  const float err = (got - expect).cwiseAbs().maxCoeff();
  std::printf("alibi %s via FetchContent: slopes(8) max error %g\n", ALIBI_VERSION_STRING, err);
  return s.size() == 8 && err == 0.0f ? 0 : 1;
}
