// SPDX-License-Identifier: MIT
// The eigen backend's layer operations: the host backends' shared operations
// (<alibi/backend/host/layers.hpp>) on the backend's threads, with key-norm bounds kept
// beside a kv_cache's keys so that decode steps with far-tile skipping read only the K/V
// tiles they compute.
#pragma once

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/attention_backward.hpp"
#include "alibi/backend/eigen/key_norms.hpp"
#include "alibi/backend/host/layers.hpp"

namespace alibi {
namespace detail {

/// alibi::key_norm_bounds for the storage types the eigen kernel reads.
struct eigen_key_norms {
  template <class S>
  static constexpr bool keeps = cpu::is_cpu_kv_type<S>;
  template <class S>
  static void compute(const tensor_view<const S, 4>& k, const tensor_view<float, 3>& bounds,
                      index_t first_key) {
    alibi::key_norm_bounds(k, bounds, first_key);
  }
};

template <>
struct layer_ops<backend::eigen> : host_layer_ops<backend::eigen, eigen_key_norms> {};

}  // namespace detail
}  // namespace alibi
