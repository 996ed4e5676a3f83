// SPDX-License-Identifier: MIT
// The reference backend's layer operations: the host backends' shared operations
// (<alibi/backend/host/layers.hpp>) on one thread, in the precision of the module's element
// type (double for the oracle). It computes every key, so a kv_cache keeps no key norms.
#pragma once

#include "alibi/backend/host/layers.hpp"
#include "alibi/backend/reference/attention.hpp"
#include "alibi/backend/reference/attention_backward.hpp"

namespace alibi {
namespace detail {

template <>
struct layer_ops<backend::reference> : host_layer_ops<backend::reference, no_key_norms> {};

}  // namespace detail
}  // namespace alibi
