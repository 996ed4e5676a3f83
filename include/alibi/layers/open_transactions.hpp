// SPDX-License-Identifier: MIT
// detail::open_transactions: the transactions open on a cache, so that a truncation made
// while one is open lowers the length that it returns the sequence to.
#pragma once

#include <algorithm>
#include <vector>

namespace alibi {
namespace detail {

/// The open transactions of one cache (not owned). A copy of a cache starts with none (so
/// does a moved-to one, through the copy): a transaction belongs to the object it began on.
template <class Tx>
class open_transactions {
 public:
  open_transactions() = default;
  open_transactions(const open_transactions&) noexcept {}
  open_transactions& operator=(const open_transactions&) noexcept { return *this; }

  void add(Tx* t) { list_.push_back(t); }
  void remove(Tx* t) noexcept {
    list_.erase(std::remove(list_.begin(), list_.end(), t), list_.end());
  }
  template <class F>
  void each(F&& f) const {
    for (Tx* t : list_) f(*t);
  }

 private:
  std::vector<Tx*> list_;
};

}  // namespace detail
}  // namespace alibi
