// SPDX-License-Identifier: MIT
// The eigen backend's layer operations: the host backends' shared operations
// (<alibi/backend/host/layers.hpp>) on the backend's threads, with key-norm bounds kept
// beside a kv_cache's keys so that decode steps with far-tile skipping read only the K/V
// tiles they compute. A target linked with alibi::kernels (ALIBI_PRECOMPILED_KERNELS) calls
// the library's copies of the float operations (precompiled_layers.hpp).
#pragma once

#include "alibi/backend/eigen/attention.hpp"
#include "alibi/backend/eigen/attention_backward.hpp"
#include "alibi/backend/eigen/key_norms.hpp"
#include "alibi/backend/host/layers.hpp"

#if defined(ALIBI_PRECOMPILED_KERNELS)
#include "alibi/backend/eigen/precompiled_layers.hpp"
#else
namespace alibi {
namespace detail {

template <>
struct layer_ops<backend::eigen> : host_layer_ops<backend::eigen, eigen_key_norms> {};

}  // namespace detail
}  // namespace alibi
#endif
