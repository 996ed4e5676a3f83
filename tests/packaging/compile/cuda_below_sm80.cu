// SPDX-License-Identifier: MIT
// Compiled for sm_75 by a test that expects it to fail: the CUDA headers must stop a device
// pass for an architecture without cp.async and bf16 mma.sync with an #error naming the need.
#include <alibi/cuda.cuh>

int main() { return 0; }
