// SPDX-License-Identifier: MIT
// What the layers' backward pass shares: the gradients container (one host buffer per
// parameter, under the parameter's name) and the check that a backend has the backward
// layer operations (the CPU backends do; CUDA does not).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "alibi/core/error.hpp"
#include "alibi/layer_config.hpp"
#include "alibi/layer_ops.hpp"

namespace alibi {

/// Gradients of a module's parameters: one host vector per parameter, with the parameter's
/// name and shape, in the order of the module's parameters() (so `for (auto& g : grads)`
/// pairs up with parameters(), and grads["q_proj.weight"] with get("q_proj.weight")).
/// Values are row-major like get(). A module's backward() fills an empty container with its
/// parameters, or overwrites a container made for the same parameters.
template <class T>
class parameter_gradients {
 public:
  struct entry {
    std::string name;
    std::vector<index_t> shape;
    std::vector<T> values;  // row-major, product of shape elements
  };

  parameter_gradients() = default;
  /// Zero gradients for the given parameters (a module's parameters()).
  explicit parameter_gradients(const std::vector<parameter_info>& params) { allocate(params); }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  typename std::vector<entry>::iterator begin() { return entries_.begin(); }
  typename std::vector<entry>::iterator end() { return entries_.end(); }
  typename std::vector<entry>::const_iterator begin() const { return entries_.begin(); }
  typename std::vector<entry>::const_iterator end() const { return entries_.end(); }

  bool contains(const std::string& name) const { return lookup(name) != nullptr; }
  /// The gradient of parameter `name`; an unknown name is an alibi::error listing the names.
  std::vector<T>& operator[](const std::string& name) { return find(name).values; }
  const std::vector<T>& operator[](const std::string& name) const {
    return const_cast<parameter_gradients&>(*this).find(name).values;
  }
  const entry& at(const std::string& name) const {
    return const_cast<parameter_gradients&>(*this).find(name);
  }

  /// Sets every gradient to 0.
  void zero() {
    for (entry& e : entries_) std::fill(e.values.begin(), e.values.end(), T(0));
  }

  /// For backward(): allocates an empty container for `params`, or checks that it was made
  /// for exactly these parameters (names and shapes, in order).
  void prepare(const std::vector<parameter_info>& params, const char* fn) {
    if (entries_.empty()) {
      allocate(params);
      return;
    }
    const std::string f = fn;
    if (entries_.size() != params.size())
      detail::raise(argument_error(
          f + ": grads holds " + detail::str(static_cast<index_t>(entries_.size())) +
          " gradients, the module has " + detail::str(static_cast<index_t>(params.size())) +
          " parameters; pass an empty parameter_gradients or one made from "
          "this module's parameters()"));
    for (std::size_t i = 0; i < params.size(); ++i)
      if (entries_[i].name != params[i].name || entries_[i].shape != params[i].shape)
        detail::raise(argument_error(f + ": grads entry " + detail::str(static_cast<index_t>(i)) +
                                     " is '" + entries_[i].name + "' " +
                                     detail::shape_text(entries_[i].shape) +
                                     ", the module's parameter is '" + params[i].name + "' " +
                                     detail::shape_text(params[i].shape)));
  }

 private:
  void allocate(const std::vector<parameter_info>& params) {
    entries_.clear();
    for (const parameter_info& p : params) {
      const index_t n = detail::checked_product(p.shape.begin(), p.shape.end());
      if (n < 0 || detail::checked_product({n, static_cast<index_t>(sizeof(T))}) < 0)
        detail::raise(argument_error("alibi::parameter_gradients: parameter '" + p.name +
                                     "' has a negative extent or more bytes than 64-bit sizes "
                                     "hold"));
      entries_.push_back({p.name, p.shape, std::vector<T>(static_cast<std::size_t>(n), T(0))});
    }
  }
  const entry* lookup(const std::string& name) const {
    for (const entry& e : entries_)
      if (e.name == name) return &e;
    return nullptr;
  }
  entry& find(const std::string& name) {
    if (const entry* e = lookup(name)) return const_cast<entry&>(*e);
    std::string known;
    for (const entry& e : entries_) known += (known.empty() ? "" : ", ") + e.name;
    detail::raise(
        argument_error("alibi::parameter_gradients: no gradient named '" + name +
                       "'; gradients: " + (known.empty() ? std::string("(none)") : known)));
  }

  std::vector<entry> entries_;
};

namespace detail {

/// Whether Backend's layer operations include the backward pass (layer_ops<B>::layer_backward:
/// the CPU backends). The modules' forward_train / backward static_assert on it.
template <class Backend, class = void>
struct has_layer_backward : std::false_type {};
template <class Backend>
struct has_layer_backward<Backend, std::enable_if_t<layer_ops<Backend>::layer_backward>>
    : std::true_type {};

}  // namespace detail

}  // namespace alibi
