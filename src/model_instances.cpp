// SPDX-License-Identifier: MIT
// alibi::kernels' layer and model instances (include/alibi/models/*_instances.inc), compiled
// once with the baseline flags: their float operations and attention calls go to the
// dispatcher, which runs the instruction-set variant the CPU supports best.
#include "alibi/models/layer_instances.hpp"

#if defined(ALIBI_PRECOMPILED_MODELS)
#include "alibi/models/causal_lm.hpp"
#endif

#if !defined(ALIBI_PRECOMPILED_KERNELS)
#error \
    "src/model_instances.cpp belongs to alibi::kernels: compile it with ALIBI_PRECOMPILED_KERNELS"
#endif

namespace alibi {
#define ALIBI_INSTANCE(...) template __VA_ARGS__;
#include "alibi/models/layer_instances.inc"
#if defined(ALIBI_PRECOMPILED_MODELS)
#include "alibi/models/causal_lm_instances.inc"
#endif
#undef ALIBI_INSTANCE
}  // namespace alibi
