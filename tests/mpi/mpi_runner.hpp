// SPDX-License-Identifier: MIT
// The interface through which the MPI sequence-parallel test cases (mpi_ring_cases.hpp) make
// their calls; without Eigen, so that a CUDA translation unit can implement it
// (mpi_cuda_runner.cu).
#pragma once

#include <mpi.h>

#include <string>

#include <alibi/mpi.hpp>

namespace mpi_cases {

/// How a case's calls run. The views are in host memory; a runner for a device backend
/// mirrors them (their strides and gaps too) into device memory and copies out and the
/// logsumexp back.
struct runner {
  virtual ~runner() = default;
  virtual std::string name() const = 0;
  /// The staging copies made so far, for a runner whose calls must stage (else -1).
  virtual long long copies() const { return -1; }
  /// One process over the whole sequences (params.logsumexp may be set).
  virtual void single(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
                      alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
                      const alibi::attention_params& params) = 0;
  virtual void ring(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
                    alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
                    const alibi::attention_params& params = {},
                    const alibi::mpi::ring_options& options = {},
                    alibi::tensor_view<float, 3> lse = {},
                    alibi::mpi::ring_stats* stats = nullptr) = 0;
  virtual void alltoall(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
                        alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
                        const alibi::attention_params& params = {},
                        alibi::tensor_view<float, 3> lse = {}) = 0;
};

}  // namespace mpi_cases
