// SPDX-License-Identifier: MIT
// Compiled with ALIBI_PRECOMPILED_KERNELS (the target links alibi::kernels): every eigen call
// here goes to the library's dispatcher, and from it to the variant it chose.
#if !defined(ALIBI_PRECOMPILED_KERNELS)
#error "this file must be compiled against alibi::kernels"
#endif
#define PRECOMPILED_CALLS_FN run_precompiled
#include "precompiled_calls.inc"

const char* precompiled_calls::precompiled_isa() { return alibi::cpu_kernels_selected().isa; }
