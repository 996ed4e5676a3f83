// SPDX-License-Identifier: MIT
// Compiled for the baseline instruction set (-march=x86-64 on x86).
#define ISA_PROBE_FN run_baseline
#include "isa_probe.inc"
