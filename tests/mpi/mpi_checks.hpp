// SPDX-License-Identifier: MIT
// What the MPI test programs share: this process's rank and the number of ranks, the failed
// checks (summed over the ranks at the end), a call that must raise alibi::error on every
// rank, and a staging copy of staged_eigen made to fail on the last rank.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <string>

#include "staged_backend.hpp"

namespace mpi_checks {

inline int rank = 0, P = 1, failures = 0;

inline void fail(const std::string& what) {
  ++failures;
  std::printf("rank %d: FAILED: %s\n", rank, what.c_str());
}

/// A call that must fail on every rank with a message containing `says`.
template <class F>
void expect_error(const std::string& name, const std::string& says, F&& call) {
  try {
    call();
    fail(name + ": accepted");
  } catch (const alibi::error& e) {
    if (std::string(e.what()).find(says) == std::string::npos)
      fail(name + ": the message '" + e.what() + "' does not say '" + says + "'");
  }
}

/// call() (every rank calls it) with staged_eigen's staging copy `at` (or, with `operation`,
/// its device operation `at`), counted from now, failing on the last rank only. Checks that
/// every rank raised an alibi::error (the failing one saying why, the others naming it) or,
/// where the last rank made fewer, that none did. Returns whether the failure happened.
template <class F>
bool expect_failure_everywhere(const std::string& name, long long at, F&& call,
                               bool operation = false) {
  using ops = alibi::detail::layer_ops<staged_eigen>;
  const bool mine = rank == P - 1;
  long long& trigger = operation ? ops::fail_op_at : ops::fail_at;
  trigger = mine ? (operation ? ops::device_ops : ops::staged_copies) + at : -1;
  std::string what;
  try {
    call();
  } catch (const alibi::error& e) {
    what = e.what();
    if (what.empty()) what = "(empty message)";
  }
  const int fired = mine && trigger == -1 ? 1 : 0;
  trigger = -1;
  ops::flush();
  int any = 0;
  MPI_Allreduce(&fired, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (any && what.empty()) fail(name + ": this rank did not raise");
  if (!any && !what.empty()) fail(name + ": raised without a failure: " + what);
  if (fired && what.find(operation ? "injected operation failure" : "injected copy failure") ==
                   std::string::npos)
    fail(name + ": the failing rank's message '" + what + "' does not say why");
  if (any && !fired && what.find("rank " + std::to_string(P - 1)) == std::string::npos)
    fail(name + ": the message '" + what + "' does not name the failing rank");
  return any != 0;
}

}  // namespace mpi_checks
