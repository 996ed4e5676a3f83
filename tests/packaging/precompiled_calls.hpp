// SPDX-License-Identifier: MIT
// The alibi::kernels test: precompiled_user.cpp (linked with alibi::kernels, so
// ALIBI_PRECOMPILED_KERNELS) and precompiled_header_only.cpp (the header-only kernels, in the
// same program) run the same calls through precompiled_calls.inc; the results must be
// bitwise equal when the dispatcher's variant has the header-only file's instruction set
// (ALIBI_CPU_ISA), within 1e-5 otherwise, and match the reference.
#pragma once

#include <cstdint>
#include <vector>

namespace precompiled_calls {

struct shape {
  std::int64_t batch, q_heads, kv_heads, q_len, k_len, head_dim;
  bool causal, skip_far_tiles;
  int threads;
};

/// Every output of the calls: the forward with float, Eigen::half and Eigen::bfloat16 K/V
/// (and the float call's logsumexp), the merge of the two key halves, and the backward.
struct outputs {
  std::vector<float> out_f32, out_f16, out_bf16, lse, merged, dq, dk, dv;
  std::vector<double> out_ref;  // the reference forward (float K/V)
};

outputs run_precompiled(const shape& s);
outputs run_header_only(const shape& s);

/// The ALIBI_CPU_ISA of the variant the dispatcher runs, and of the header-only file.
const char* precompiled_isa();
const char* header_only_isa();

}  // namespace precompiled_calls
