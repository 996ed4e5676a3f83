// SPDX-License-Identifier: MIT
// The two-ISA test: isa_baseline.cpp and isa_native.cpp include this file and are compiled
// with different -march flags into one program (see tests/CMakeLists.txt).
#pragma once

#include <string>

namespace isa_probe {

/// The ALIBI_CPU_ISA name of the calling translation unit, and the largest difference
/// between the fused eigen backend and the reference on a fixed problem computed there.
struct result {
  std::string isa;
  double max_err = 0.0;
};

result run_baseline();
result run_native();

}  // namespace isa_probe
