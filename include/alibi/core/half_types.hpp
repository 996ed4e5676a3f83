// SPDX-License-Identifier: MIT
// Eigen's 16-bit floating-point types, declared only. The backends name them in their type
// checks (which element types a call may use) without including Eigen: a translation unit that
// passes them has included Eigen itself, and one that does not (an nvcc file checking against
// the reference, a file calling the precompiled kernels) stays free of Eigen's headers.
#pragma once

namespace Eigen {
struct half;
struct bfloat16;
}  // namespace Eigen
