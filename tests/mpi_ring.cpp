// SPDX-License-Identifier: MIT
// alibi::mpi::ring_attention and alltoall_attention under mpirun (ctest label mpi, 1, 2, 3 and 4
// ranks; the cases are tests/mpi_ring_cases.hpp), with the eigen backend and with staged_eigen
// (tests/staged_backend.hpp), which takes the host-staging path of backend::cuda on the CPU:
// it must have staged copies, and its results are held to the same bounds. Exit status: the
// number of failed checks over all ranks (0 = pass).
#include "mpi_ring_cases.hpp"
#include "staged_backend.hpp"

int main(int argc, char** argv) {
  mpi_cases::backend_runner<alibi::backend::eigen> eigen({1}, "eigen");
  mpi_cases::backend_runner<staged_eigen> staged({{1}}, "staged");
  return mpi_cases::run_main(argc, argv, {&eigen, &staged}, [] {
    // The staged runner went through the staging copies (a path that silently took the
    // host branch would pass every other check).
    if (alibi::detail::layer_ops<staged_eigen>::staged_copies == 0)
      mpi_cases::fail("staged: no staging copy was made");
  });
}
