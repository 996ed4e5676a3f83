// SPDX-License-Identifier: MIT
// MPI error handling and the failure protocol of alibi::mpi: MPI return codes as
// alibi::error (check_mpi), and the rule that a failure on one rank is raised on every rank
// at the next check instead of leaving the others waiting in a collective (guarded collects
// a staged backend's failure, all_succeeded shares it with one MPI_Allgather).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "alibi/core/error.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// MPI's return code as an alibi::error naming the call.
inline void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int n = 0;
  MPI_Error_string(rc, text, &n);
  raise(error(std::string("alibi::mpi: ") + what + " failed: " + text));
}

/// This rank's index in comm, and comm's number of ranks.
inline int comm_rank(MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}
inline int comm_size(MPI_Comm comm) {
  int P = 1;
  check_mpi(MPI_Comm_size(comm, &P), "MPI_Comm_size");
  return P;
}

/// After a stretch of work in which a rank may have failed (a staged backend's copy or
/// allocation, say: `failure` is this rank's, empty if none): one MPI_Allgather of a word
/// per rank, then every rank raises, its own error or "rank r failed", or none does. So a
/// failure on one rank never leaves the others waiting in the next collective.
inline void all_succeeded(MPI_Comm comm, const std::string& fn, const std::string& failure) {
  const int P = comm_size(comm);
  int mine = failure.empty() ? 1 : 0;
  std::vector<int> all(static_cast<std::size_t>(P));
  check_mpi(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm),
            "MPI_Allgather (failure check)");
  if (!failure.empty()) raise(error(failure));
  for (int r = 0; r < P; ++r)
    if (all[static_cast<std::size_t>(r)] == 0)
      raise(error(fn + ": rank " + std::to_string(r) + " failed (its error says why)"));
}

/// Runs f, for a staged backend with its exceptions caught into `failure` (the first only;
/// after one, the later work is skipped) for all_succeeded to report on every rank. Host
/// backends run f as it is.
template <class Backend, class F>
void guarded(std::string& failure, const std::string& fn, F&& f) {
  if constexpr (staged<Backend>) {
    if (!failure.empty()) return;
    try {
      f();
    } catch (const std::exception& e) {
      failure = fn + ": " + e.what();
    }
  } else {
    (void)failure;
    (void)fn;
    f();
  }
}

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
