// SPDX-License-Identifier: MIT
// alibi::error and the status type returned by the non-throwing argument checks.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "alibi/core/config.hpp"

namespace alibi {

/// Thrown for every invalid argument. The message names the argument and what was
/// expected, e.g. "alibi::attention: k.extent(1) (kv heads) must divide q.extent(1) (8), got 3".
class error : public std::invalid_argument {
 public:
  explicit error(const std::string& what) : std::invalid_argument(what) {}
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
  /// Throws alibi::error when the status is a failure.
  void throw_if_failed() const {
    if (!ok_) detail::raise(error(message_));
  }

 private:
  bool ok_ = true;
  std::string message_;
};

}  // namespace alibi
