// SPDX-License-Identifier: MIT
// Compiled for this machine's instruction set (-march=native).
#define ISA_PROBE_FN run_native
#include "isa_probe.inc"
