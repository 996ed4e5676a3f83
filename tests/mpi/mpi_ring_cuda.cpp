// SPDX-License-Identifier: MIT
// alibi::mpi::ring_attention and alltoall_attention with backend::cuda under mpirun (ctest labels
// mpi and cuda; the cases are tests/mpi/mpi_ring_cases.hpp, the device mirroring
// tests/mpi/mpi_cuda_runner.cu): the tensors in device memory, staged through host memory for MPI.
// The bounds come from the same-run single-process CUDA result. Without a CUDA device it prints
// "SKIPPED: no CUDA device" (ctest reports the test as skipped). Exit status: the number of failed
// checks over all ranks (0 = pass).
#include <cstdio>
#include <memory>

#include "mpi_ring_cases.hpp"

namespace mpi_cases {
bool cuda_device_present();
std::unique_ptr<runner> make_cuda_runner();
}  // namespace mpi_cases

int main(int argc, char** argv) {
  if (!mpi_cases::cuda_device_present()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  const std::unique_ptr<mpi_cases::runner> cuda = mpi_cases::make_cuda_runner();
  return mpi_cases::run_main(argc, argv, {cuda.get()}, [] {});
}
