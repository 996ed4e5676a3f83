// SPDX-License-Identifier: MIT
// The backend policy types. Each is a small object carrying that backend's runtime state;
// the attention front end dispatches on its type. Declared here, without any third-party
// header, so that a call with a backend whose implementation header is missing fails with
// a readable static_assert rather than an unknown name.
#pragma once

#include <string>
#include <thread>

#include "alibi/core/error.hpp"

struct CUstream_st;  // the CUDA runtime's stream type; cudaStream_t is CUstream_st*

namespace alibi {

/// Memory spaces: where a backend reads and writes the tensors it is given. The front end
/// checks the values of per-batch views (lengths, offsets) only where it can read them.
struct host_space {};    // ordinary host memory
struct device_space {};  // CUDA device memory (or managed memory)

namespace backend {

/// A backend tag: a small struct carrying the backend's runtime state and naming its memory
/// space. A new backend is one more tag here plus one folder under alibi/backend/ with
/// the attention_impl (and layer_ops) specializations; see docs/architecture.md.

/// The oracle: materializes scores and bias, softmax, then multiplies by V, accumulating in
/// double. Slow (O(L^2) memory); for tests and inspection. <alibi/backend/reference/attention.hpp>
struct reference {
  using memory_space = host_space;
};

/// The fused CPU backend (Eigen GEMMs, online softmax). `threads` <= 0 means one thread per
/// hardware thread; at most max_threads() (a call asking for more is an alibi::error naming
/// `threads`). Results do not depend on the thread count. The threads beyond the caller's
/// come from one process-wide pool, started on first use and kept until exit.
/// <alibi/backend/eigen/attention.hpp>
struct eigen {
  using memory_space = host_space;
  int threads = 1;
  /// 4 x the hardware threads (64 where the hardware does not say). More would only add
  /// threads waiting for a core; a typo (INT_MAX, a byte count) would try to start that many.
  static int max_threads() {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw > 0 ? static_cast<int>(hw < (1u << 20) ? hw : 1u << 20) * 4 : 64;
  }
};

/// The CUDA backend: work is queued on `stream` (nullptr: the legacy default stream) and
/// attention() returns without synchronizing. <alibi/cuda.cuh>
///
/// Far-tile skipping (attention_params::skip_far_tiles) is opt-in on this backend: it
/// engages only with far_tile_skipping set, and then only for calls with at least
/// skip_min_keys keys. Why: in an earlier form, the device code that skips passed the GPU
/// tests and was faster than the dense kernel only from about skip_min_keys keys on; the
/// committed form (cheaper side tests, coalesced key norms) has not run on a GPU yet
/// (docs/journal/2026-12-design-measurements.md, "core/backends.hpp: cuda::skip_min_keys").
/// See docs/cuda.md.
struct cuda {
  using memory_space = device_space;
  CUstream_st* stream = nullptr;
  bool far_tile_skipping = false;
  long long skip_min_keys = 16384;
};

}  // namespace backend

namespace detail {

/// Whether an eigen backend's `threads` is within backend::eigen::max_threads().
inline status threads_status(int threads) {
  if (threads <= backend::eigen::max_threads()) return {};
  return status::failure("alibi::backend::eigen: threads must be at most " +
                         std::to_string(backend::eigen::max_threads()) +
                         " (4 x the hardware threads), got " + std::to_string(threads));
}

}  // namespace detail
}  // namespace alibi
