// SPDX-License-Identifier: MIT
// The rows of the edge-case checklist that can be stated as properties, on every CPU
// backend (the reference included): the bodies are in edge_cases.hpp, shared with the CUDA
// backend's instance (test_cuda_edge_cases.cu); each SECTION names its row.
#include <catch2/catch.hpp>

#include "backends.hpp"
#include "edge_cases.hpp"

TEMPLATE_TEST_CASE("edge cases", "[edge]", alibi_test::reference_backend, alibi_test::eigen_1thread,
                   alibi_test::eigen_2threads) {
  alibi_test::edge::basic<TestType>();
}
