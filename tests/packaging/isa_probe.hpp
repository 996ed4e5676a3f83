// SPDX-License-Identifier: MIT
// The two-ISA test: isa_baseline.cpp and isa_native.cpp include this file and are compiled
// with different -march flags into one program (see tests/CMakeLists.txt).
#pragma once

#include <string>

namespace isa_probe {

/// The ALIBI_CPU_ISA name of the calling translation unit, and the largest difference
/// between the fused eigen backend and the reference on a fixed problem computed there
/// (fp32 and fp16 K/V), and the kernel's fp16/bf16 -> fp32 conversion over every bit pattern
/// (F16C / AVX2 code in the native unit, the portable code in the baseline one).
struct result {
  std::string isa;
  double max_err = 0.0;
  double half_kv_max_err = 0.0;    // the same with K and V stored as Eigen::half
  long conversion_mismatches = 0;  // fp16 / bf16 bit patterns the kernel converts wrongly
};

result run_baseline();
result run_native();

}  // namespace isa_probe
