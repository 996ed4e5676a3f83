// SPDX-License-Identifier: MIT
// alibi::error, the base of the exceptions alibi throws, its kinds, and the status type
// returned by the non-throwing argument checks.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "alibi/core/config.hpp"

namespace alibi {

/// The base of every exception alibi throws: `catch (const alibi::error&)` catches them all,
/// and what() is the message, which names the function and, for arguments, the argument and
/// what was expected, e.g. "alibi::attention: k.extent(1) (kv heads) must divide q.extent(1)
/// (8), got 3". Each kind below also derives from the standard exception of its category, so
/// `catch (const std::invalid_argument&)` or `catch (const std::runtime_error&)` see the ones
/// they should (and `catch (const std::exception&)` all of them). Why a base outside
/// std::exception: a class deriving from two standard exceptions would hold std::exception
/// twice, which no `catch (const std::exception&)` can match.
class error {
 public:
  virtual ~error() = default;
  virtual const char* what() const noexcept = 0;

 protected:
  error() = default;
  error(const error&) = default;
  error& operator=(const error&) = default;
};

/// An invalid argument: a shape, a stride, a value, a configuration, ranks that disagree on
/// what must match.
class argument_error : public std::invalid_argument, public error {
 public:
  explicit argument_error(const std::string& what) : std::invalid_argument(what) {}
  const char* what() const noexcept override { return std::invalid_argument::what(); }
};

/// A file that cannot be read or written, or whose contents are not what its format says (a
/// corrupt safetensors file, a config.json that is not an ALiBi model of a known family).
class io_error : public std::runtime_error, public error {
 public:
  explicit io_error(const std::string& what) : std::runtime_error(what) {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// A call that would exceed what an object holds (a KV cache's capacity).
class capacity_error : public std::runtime_error, public error {
 public:
  explicit capacity_error(const std::string& what) : std::runtime_error(what) {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// A failure of a multi-process call: an MPI error, or a failure on another rank (each
/// rank's own failure, e.g. std::bad_alloc, is raised as this on that rank too).
class distributed_error : public std::runtime_error, public error {
 public:
  explicit distributed_error(const std::string& what) : std::runtime_error(what) {}
  const char* what() const noexcept override { return std::runtime_error::what(); }
};

/// The result of a non-throwing check: ok() or a message in the same words `error` uses.
class status {
 public:
  status() = default;
  static status failure(std::string message) {
    status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const std::string& message() const noexcept { return message_; }
  /// Throws alibi::argument_error when the status is a failure.
  void throw_if_failed() const {
    if (!ok_) detail::raise(argument_error(message_));
  }

 private:
  bool ok_ = true;
  std::string message_;
};

}  // namespace alibi
