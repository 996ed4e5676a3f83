// SPDX-License-Identifier: MIT
// MPI error handling and the failure protocol of alibi::mpi: MPI return codes as
// alibi::error (check_mpi), the rule that a failure on one rank is raised on every rank at
// the next check instead of leaving the others waiting in a collective (a call_failure
// records it, guarded / guard_all collect it, all_succeeded shares it with one
// MPI_Allreduce), the per-communicator call number that keeps one call's messages from
// pairing with another's, and the request set that keeps a message's buffer alive until
// the message is done.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

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
  raise(distributed_error(std::string("alibi::mpi: ") + what + " failed: " + text));
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

/// What failed on this rank during a call, if anything. Recording a failure never throws:
/// when even its message cannot be kept (memory is short), the flag alone still takes the
/// rank through the rest of the call's messages to the next check.
class call_failure {
 public:
  bool failed() const noexcept { return failed_; }
  void record(const char* fn, const char* what) noexcept {
    if (failed_) return;  // the first failure is the cause; the rest follow from it
    failed_ = true;
    try {
      message_ = std::string(fn) + ": " + what;
    } catch (...) {
      message_.clear();
    }
  }
  /// The error this rank raises (building it may itself throw std::bad_alloc).
  std::string message(const char* fn) const {
    return message_.empty() ? std::string(fn) + ": failed (out of memory)" : message_;
  }

 private:
  bool failed_ = false;
  std::string message_;
};

/// The lowest rank whose stretch of work failed (`failed`: this rank's), or the number of
/// ranks if none did: one MPI_Allreduce of a word, allocating nothing before it, so a rank
/// short of memory still reaches it.
inline int lowest_failed_rank(MPI_Comm comm, bool failed) {
  const int P = comm_size(comm);
  int mine = failed ? comm_rank(comm) : P, lowest = P;
  check_mpi(MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm),
            "MPI_Allreduce (failure check)");
  return lowest;
}

/// Whether every rank's stretch of work succeeded (lowest_failed_rank): then every rank
/// raises, its own error or "rank r failed", or none does. So a failure on one rank never
/// leaves the others waiting in the next collective.
inline void all_succeeded(MPI_Comm comm, const char* fn, const call_failure& failure) {
  const int lowest = lowest_failed_rank(comm, failure.failed());
  if (failure.failed()) raise(distributed_error(failure.message(fn)));
  if (lowest < comm_size(comm))
    raise(distributed_error(std::string(fn) + ": rank " + std::to_string(lowest) +
                            " failed (its error says why)"));
}

/// all_succeeded for a failure kept as a message (empty: none).
inline void all_succeeded(MPI_Comm comm, const std::string& fn, const std::string& failure) {
  const int lowest = lowest_failed_rank(comm, !failure.empty());
  if (!failure.empty()) raise(distributed_error(failure));
  if (lowest < comm_size(comm))
    raise(distributed_error(fn + ": rank " + std::to_string(lowest) +
                            " failed (its error says why)"));
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

/// Runs f on any backend unless this rank already failed; an exception of f (an
/// alibi::error, std::bad_alloc, a backend's error) is recorded in `failure` instead of
/// leaving this rank's part of the call's messages undone. The caller keeps taking part in
/// the call's fixed schedule of messages and raises at the next all_succeeded.
template <class F>
void guard_all(call_failure& failure, const char* fn, F&& f) {
  if (failure.failed()) return;
  try {
    f();
  } catch (const std::exception& e) {
    failure.record(fn, e.what());
  }
}

/// The number of this call among the alibi::mpi calls on comm (1, 2, ...), counted on each
/// rank: every call agrees on it, and its point-to-point tags carry it, so that a call never
/// takes another call's messages for its own. Kept as an attribute of comm (in the
/// attribute's pointer value itself: nothing to allocate or free); a duplicate of comm
/// starts again from 1.
inline std::int64_t next_call_number(MPI_Comm comm) {
  static const int keyval = [] {
    int k = MPI_KEYVAL_INVALID;
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &k, nullptr),
              "MPI_Comm_create_keyval (call numbers)");
    return k;
  }();
  void* value = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(comm, keyval, &value, &found), "MPI_Comm_get_attr (call number)");
  const std::int64_t n =
      (found ? static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(value)) : 0) + 1;
  check_mpi(MPI_Comm_set_attr(comm, keyval, reinterpret_cast<void*>(static_cast<std::intptr_t>(n))),
            "MPI_Comm_set_attr (call number)");
  return n;
}

/// The point-to-point tags of one call: [base, base + span). A call wants `per_call` tags,
/// `unit` per step (per_call a multiple of unit), where MPI allows tags [0, ub] (ub at least
/// 32767). Calls take turns through the tags, so that consecutive calls never share one.
/// A call that wants more tags than there are (a ring of more than (ub + 1) / 4 ranks) takes
/// them all and reuses them cyclically, `span` apart (a multiple of unit): a step's messages
/// then share tags with one span/unit steps earlier, which MPI's non-overtaking order between
/// two ranks keeps matched in step order (each rank posts its steps in order).
struct tag_window {
  int base = 0;
  int span = 0;
};

inline tag_window tag_window_for(std::int64_t ub, std::int64_t call, std::int64_t per_call,
                                 int unit) {
  tag_window w;
  const std::int64_t all = (ub + 1) / unit * unit;
  if (per_call > all || per_call <= 0) {
    w.span = static_cast<int>(all);
    return w;
  }
  const std::int64_t turns = all / per_call;
  w.base = static_cast<int>((call % turns) * per_call);
  w.span = static_cast<int>(per_call);
  return w;
}

/// tag_window_for with comm's MPI_TAG_UB.
inline tag_window call_tags(MPI_Comm comm, std::int64_t call, std::int64_t per_call, int unit) {
  void* value = nullptr;
  int found = 0;
  check_mpi(MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &found), "MPI_Comm_get_attr (MPI_TAG_UB)");
  return tag_window_for(found ? *static_cast<int*>(value) : 32767, call, per_call, unit);
}

/// The non-blocking messages in flight: none of them outlives this object, which waits for
/// them in its destructor (after cancelling them: the call is being abandoned), so that their
/// buffers, declared before it, are never freed with a message pending.
class request_set {
 public:
  static constexpr int capacity = 8;
  request_set() {
    for (MPI_Request& r : req_) r = MPI_REQUEST_NULL;
  }
  request_set(const request_set&) = delete;
  request_set& operator=(const request_set&) = delete;
  ~request_set() {
    if (count_ == 0) return;
    for (int i = 0; i < count_; ++i)
      if (req_[i] != MPI_REQUEST_NULL) MPI_Cancel(&req_[i]);
    MPI_Waitall(count_, req_, MPI_STATUSES_IGNORE);
  }
  /// Where the next request goes.
  MPI_Request* next() {
    if (count_ == capacity)
      raise(argument_error("alibi::mpi: more requests than a request_set holds"));
    return &req_[count_++];
  }
  int size() const { return count_; }
  /// Waits for every message; they are done afterwards unless MPI reports an error.
  void wait_all(const char* what) {
    if (count_ == 0) return;
    check_mpi(MPI_Waitall(count_, req_, MPI_STATUSES_IGNORE), what);
    count_ = 0;
  }

 private:
  MPI_Request req_[capacity];
  int count_ = 0;
};

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
