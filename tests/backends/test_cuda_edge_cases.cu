// SPDX-License-Identifier: MIT
// The edge-case checklist (E1-E23, edge_cases.hpp) on the CUDA backend in float: the same
// bodies as the CPU backends' (test_edge_cases.cpp, test_edge_cases_more.cpp), with the host
// data staged on the device by cuda_float_runner (cuda_common.cuh). Run by alibi_cuda_tests,
// which reports "skipped" (exit code 77) when no GPU is present.
#include <catch2/catch.hpp>

#include "cuda_common.cuh"
#include "edge_cases.hpp"

using runner = alibi_test::cuda_float_runner;

TEST_CASE("cuda: edge cases", "[cuda][edge]") { alibi_test::edge::basic<runner>(); }

TEST_CASE("cuda: more edge cases against the oracle", "[cuda][edge]") {
  alibi_test::edge::oracle<runner>();
}

TEST_CASE("cuda: E11: tensor-parallel slopes equal the matching heads of the full model",
          "[cuda][edge]") {
  alibi_test::edge::tensor_parallel_slopes<runner>();
}

TEST_CASE("cuda: E19: broadcast (stride 0) and sliced KV-cache views", "[cuda][edge]") {
  alibi_test::edge::broadcast_views<runner>();
}

TEST_CASE("cuda: E18: offsets beyond 2^31 elements use 64-bit index math", "[cuda][edge]") {
  alibi_test::edge::offsets_beyond_2_31<runner>();
}

TEST_CASE("cuda: only distances matter: positions near 2^56 give the same result", "[cuda][edge]") {
  alibi_test::edge::far_positions<runner>();
}
