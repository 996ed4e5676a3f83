// SPDX-License-Identifier: MIT
// Must not compile: a column-major matrix passed to view_bshd (its head_dim would not be
// contiguous). The "eigen: view_bshd refuses column-major matrices" test checks the message.
#include <alibi/interop/eigen.hpp>

int main() {
  Eigen::MatrixXf tokens(10, 12);  // Eigen's default storage order: column-major
  return static_cast<int>(alibi::view_bshd(tokens, 2, 5, 3, 4).extent(0));
}
