// SPDX-License-Identifier: MIT
// The same calls with the header-only kernels, in the program that links alibi::kernels: the
// two copies (same instruction set, same names) must agree bitwise, and linking both must be
// fine (explicit and implicit instantiations of one template).
#undef ALIBI_PRECOMPILED_KERNELS
#define PRECOMPILED_CALLS_FN run_header_only
#include "precompiled_calls.inc"
