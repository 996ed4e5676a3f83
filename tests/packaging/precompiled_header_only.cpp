// SPDX-License-Identifier: MIT
// The same calls with the header-only kernels, in the program that links alibi::kernels:
// linking both must be fine (where the dispatcher's variant has this file's instruction set,
// the explicit and implicit instantiations of one template).
#undef ALIBI_PRECOMPILED_KERNELS
#define PRECOMPILED_CALLS_FN run_header_only
#include "precompiled_calls.inc"

#define PRECOMPILED_STRINGIFY_IMPL(x) #x
#define PRECOMPILED_STRINGIFY(x) PRECOMPILED_STRINGIFY_IMPL(x)
const char* precompiled_calls::header_only_isa() { return PRECOMPILED_STRINGIFY(ALIBI_CPU_ISA); }
