// SPDX-License-Identifier: MIT
// alibi::cuda_error: a CUDA runtime failure (launch error, out of memory, ...) reported by
// the CUDA backend, a std::runtime_error and an alibi::error. Invalid arguments are
// alibi::argument_error, as on every backend.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "alibi/core/config.hpp"
#include "alibi/core/error.hpp"

namespace alibi {

class cuda_error : public std::runtime_error, public error {
 public:
  cuda_error(cudaError_t code, const std::string& what)
      : std::runtime_error(what + ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) +
                           ")"),
        code_(code) {}
  /// A failure of a CUDA library (cuBLAS) whose status is not a cudaError_t: `what` names
  /// the step and the library's own status; code() is cudaErrorUnknown.
  explicit cuda_error(const std::string& what)
      : std::runtime_error(what), code_(cudaErrorUnknown) {}
  cudaError_t code() const noexcept { return code_; }
  const char* what() const noexcept override { return std::runtime_error::what(); }

 private:
  cudaError_t code_;
};

namespace cuda_detail {

/// Turns a CUDA runtime status into alibi::cuda_error naming the step that failed.
inline void check(cudaError_t code, const char* step) {
  if (code != cudaSuccess) detail::raise(cuda_error(code, std::string("alibi (cuda): ") + step));
}

}  // namespace cuda_detail
}  // namespace alibi
