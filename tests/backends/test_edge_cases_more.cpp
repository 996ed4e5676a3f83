// SPDX-License-Identifier: MIT
// More rows of the edge-case checklist, compared with the double-precision oracle on every
// fused CPU backend: shapes (E3, E4, E8), head counts (E10), caller and tensor-parallel
// slopes (E11), long distances (E12, E13), large logits (E14), masks (E15), NaN in unused
// memory (E16), 64-bit offsets and many heads (E18), strided, permuted or broadcast layouts
// (E19) and scales (E21). The bodies are in edge_cases.hpp, shared with the CUDA backend's
// instance (test_cuda_edge_cases.cu).
#include <catch2/catch.hpp>

#include "backends.hpp"
#include "edge_cases.hpp"

TEMPLATE_TEST_CASE("more edge cases against the oracle", "[edge][heavy]", alibi_test::eigen_1thread,
                   alibi_test::eigen_2threads) {
  alibi_test::edge::oracle<TestType>();
}

TEMPLATE_TEST_CASE("E11: tensor-parallel slopes equal the matching heads of the full model",
                   "[edge]", alibi_test::reference_backend, alibi_test::eigen_2threads) {
  alibi_test::edge::tensor_parallel_slopes<TestType>();
}

TEMPLATE_TEST_CASE("E19: broadcast (stride 0) and sliced KV-cache views", "[edge]",
                   alibi_test::reference_backend, alibi_test::eigen_1thread,
                   alibi_test::eigen_2threads) {
  alibi_test::edge::broadcast_views<TestType>();
}

TEMPLATE_TEST_CASE("E18: offsets beyond 2^31 elements use 64-bit index math", "[edge]",
                   alibi_test::reference_backend, alibi_test::eigen_2threads) {
  alibi_test::edge::offsets_beyond_2_31<TestType>();
}

TEMPLATE_TEST_CASE("only distances matter: positions near 2^56 give the same result", "[edge]",
                   alibi_test::reference_backend, alibi_test::eigen_2threads) {
  alibi_test::edge::far_positions<TestType>();
}
