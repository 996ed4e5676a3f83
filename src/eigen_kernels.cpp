// SPDX-License-Identifier: MIT
// alibi::kernels: the eigen backend's kernels compiled once, for every element type the
// backend takes. Translation units linked with the target (ALIBI_PRECOMPILED_KERNELS) see
// only the declarations (backend/eigen/attention.hpp, attention_backward.hpp) and call these.
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

template void attention_kernel<float>(int, const attention_problem&,
                                      const tensor_view<const float, 4>&,
                                      const tensor_view<const float, 4>&,
                                      const tensor_view<const float, 4>&,
                                      const tensor_view<float, 4>&,
                                      const tensor_view<const float, 5>&);
template void attention_kernel<Eigen::half>(int, const attention_problem&,
                                            const tensor_view<const float, 4>&,
                                            const tensor_view<const Eigen::half, 4>&,
                                            const tensor_view<const Eigen::half, 4>&,
                                            const tensor_view<float, 4>&,
                                            const tensor_view<const Eigen::half, 5>&);
template void attention_kernel<Eigen::bfloat16>(int, const attention_problem&,
                                                const tensor_view<const float, 4>&,
                                                const tensor_view<const Eigen::bfloat16, 4>&,
                                                const tensor_view<const Eigen::bfloat16, 4>&,
                                                const tensor_view<float, 4>&,
                                                const tensor_view<const Eigen::bfloat16, 5>&);
template void merge_kernel<float>(int, const partial_merge_args<float>&);
template void merge_kernel<double>(int, const partial_merge_args<double>&);
template void backward_kernel<float>(int, const attention_problem&,
                                     const attention_backward_tensors<float, float, float, float>&);

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
