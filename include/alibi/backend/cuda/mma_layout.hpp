// SPDX-License-Identifier: MIT
// Where each lane of a warp reads and holds data for the m16n8k16 tensor-core instruction
// (PTX mma.sync ... m16n8k16, with ldmatrix.x4 loading the operands), as host/device
// functions. The CUDA kernel uses them; the unit tests emulate ldmatrix and mma on the CPU
// from the PTX fragment definitions and check, through these functions, that the kernel's
// products are the right ones.
#pragma once

#include "alibi/core/config.hpp"

namespace alibi {
namespace detail {

/// A (row, column) offset inside a 16 x 16 block of 16-bit elements in shared memory.
struct lane_offset {
  int row = 0, col = 0;
};

/// ldmatrix.x4 address of `lane` for an A operand (16 rows m x 16 columns k, row-major):
/// matrices 0..3 are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
/// (rows 8-15, k 8-15), which are the fragment registers a0..a3.
ALIBI_HOST_DEVICE constexpr lane_offset ldsm_a(int lane) {
  return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8};
}

/// ldmatrix.x4 address for two B operands (k 16 x n 8 each) stored n-major: smem rows are
/// n (keys), columns k (head dim), as K is. Registers 0, 1 are b0, b1 of the n tile 0-7 and
/// registers 2, 3 those of the n tile 8-15.
ALIBI_HOST_DEVICE constexpr lane_offset ldsm_b_nmajor(int lane) {
  return {(lane & 7) + (lane >> 4) * 8, ((lane >> 3) & 1) * 8};
}

/// ldmatrix.x4.trans address for two B operands stored k-major: smem rows are k (keys),
/// columns n (head dim), as V is. Registers 0, 1 are b0, b1 of the n tile 0-7 and 2, 3
/// those of the n tile 8-15.
ALIBI_HOST_DEVICE constexpr lane_offset ldsm_b_kmajor(int lane) {
  return {(lane & 7) + ((lane >> 3) & 1) * 8, (lane >> 4) * 8};
}

/// The accumulator element e (0..3) of `lane` in a 16 x 8 C tile: rows lane/4 and
/// lane/4 + 8, columns 2 (lane % 4) and 2 (lane % 4) + 1.
ALIBI_HOST_DEVICE constexpr lane_offset acc_element(int lane, int e) {
  return {(lane >> 2) + (e >> 1) * 8, (lane & 3) * 2 + (e & 1)};
}

}  // namespace detail
}  // namespace alibi
