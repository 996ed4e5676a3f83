// SPDX-License-Identifier: MIT
// The optional MPI component (CMake target alibi::mpi, which brings MPI::MPI_CXX; the core
// library has no MPI dependency): ALiBi attention and layers over an MPI communicator.
//   ring_attention      sequence parallelism: K/V parts travel around the ring of ranks,
//                       overlapped with the attention on the part in hand, with far-chunk
//                       skipping of the pairs ALiBi makes negligible (mpi/ring.hpp);
//   alltoall_attention  sequence parallelism by re-sharding from sequence to heads and back
//                       (DeepSpeed-Ulysses, mpi/alltoall.hpp);
//   tensor_parallel_layer, tensor_parallel_attention
//                       Megatron tensor parallelism of a layer or an attention module
//                       (mpi/tensor_parallel.hpp).
// Every function takes a host backend (eigen, reference: MPI reads and writes the buffers they
// compute on) or backend::cuda (include <alibi/cuda.cuh> first, in a .cu file): its tensors
// stay in device memory and the parts MPI sends and receives are staged through host buffers.
// An argument one rank refuses, ranks that disagree, or a failure on one rank is an error on
// every rank, never a hang. The internals live in alibi::detail::mpi.
#pragma once

#include "alibi/mpi/agreement.hpp"
#include "alibi/mpi/alltoall.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/far_chunks.hpp"
#include "alibi/mpi/layout.hpp"
#include "alibi/mpi/options.hpp"
#include "alibi/mpi/ring.hpp"
#include "alibi/mpi/staging.hpp"
#include "alibi/mpi/tensor_parallel.hpp"
