// SPDX-License-Identifier: MIT
// alibi::kernels: the eigen backend's kernels compiled once, for every element type the
// backend takes. Translation units linked with the target (ALIBI_PRECOMPILED_KERNELS) see
// only the declarations (backend/eigen/attention.hpp) and call these.
#include <Eigen/Core>

#include "alibi/backend/eigen/attention_backward_kernel.hpp"
#include "alibi/backend/eigen/attention_kernel.hpp"

#if defined(ALIBI_PRECOMPILED_KERNELS)
#error "src/eigen_kernels.cpp defines the kernels: compile it without ALIBI_PRECOMPILED_KERNELS"
#endif

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

#define ALIBI_EIGEN_INSTANCE(...) template __VA_ARGS__;
#include "alibi/backend/eigen/instances.inc"
#undef ALIBI_EIGEN_INSTANCE

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
