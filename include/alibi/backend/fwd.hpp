// SPDX-License-Identifier: MIT
// The backend policy types. Each is a small object carrying that backend's runtime state;
// the attention front end dispatches on its type. Declared here, without any third-party
// header, so that a call with a backend whose implementation header is missing fails with
// a readable static_assert rather than an unknown name.
#pragma once

struct CUstream_st;  // the CUDA runtime's stream type; cudaStream_t is CUstream_st*

namespace alibi {
namespace backend {

/// The oracle: materializes scores and bias, softmax, then multiplies by V, accumulating in
/// double. Slow (O(L^2) memory); for tests and inspection. <alibi/backend/reference.hpp>
struct reference {};

/// The fused CPU backend (Eigen GEMMs, online softmax). `threads` <= 0 means one thread per
/// hardware thread. Results do not depend on the thread count. <alibi/backend/eigen.hpp>
struct eigen {
  int threads = 1;
};

/// The CUDA backend: work is queued on `stream` (nullptr: the legacy default stream) and
/// attention() returns without synchronizing. <alibi/cuda.cuh>
struct cuda {
  CUstream_st* stream = nullptr;
};

}  // namespace backend
}  // namespace alibi
