// SPDX-License-Identifier: MIT
// With alibi::kernels (ALIBI_PRECOMPILED_KERNELS), the float layers on the eigen backend
// (norm_layer, multi_head_attention, transformer_layer, kv_cache with float, half or bfloat16
// storage) are compiled in the library: this header declares those instances
// (layer_instances.inc), so that a file using them compiles only their calls. Included by
// <alibi/alibi.hpp> and <alibi/models/causal_lm.hpp>; header-only it declares nothing.
#pragma once

#include "alibi/backend/eigen/layers.hpp"
#include "alibi/core/half_types.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/norm.hpp"
#include "alibi/layers/transformer_layer.hpp"

#if defined(ALIBI_PRECOMPILED_KERNELS)
namespace alibi {
#define ALIBI_INSTANCE(...) extern template __VA_ARGS__;
#include "alibi/models/layer_instances.inc"
#undef ALIBI_INSTANCE
}  // namespace alibi
#endif
