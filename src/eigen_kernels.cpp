// SPDX-License-Identifier: MIT
// alibi::kernels: the eigen backend's kernels compiled once for every element type the
// backend takes, and the layers' float operations (GEMMs, norms, activations). CMake compiles this
// file once per instruction-set variant (ALIBI_KERNELS_VARIANTS), each with its own -march, so each
// lands in its own ALIBI_CPU_ISA namespace; its table (kernel_table_<ALIBI_CPU_ISA>) is what the
// dispatcher calls. Declares, rather than defines, what the variants share through the dispatcher
// (the thread pool): every other symbol of this file is made local to the variant's object.
#define ALIBI_KERNELS_VARIANT 1

#include <Eigen/Core>

#include "alibi/backend/eigen/attention_backward_kernel.hpp"
#include "alibi/backend/eigen/attention_kernel.hpp"
#include "alibi/backend/eigen/layers.hpp"
#include "kernel_variant.hpp"

#if defined(ALIBI_PRECOMPILED_KERNELS)
#error "src/eigen_kernels.cpp defines the kernels: compile it without ALIBI_PRECOMPILED_KERNELS"
#endif
#if defined(_OPENMP)
#error "alibi::kernels' variants are compiled without OpenMP: the dispatcher names them so"
#endif

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

#define ALIBI_EIGEN_INSTANCE(...) template __VA_ARGS__;
#include "alibi/backend/eigen/instances.inc"
#undef ALIBI_EIGEN_INSTANCE

namespace {

// The backward's tensors carry the caller's instruction set in their type (Isa): the entry
// point's tag is replaced by this file's.
void backward_f32(
    int threads, const attention_problem& p,
    const attention_backward_tensors<float, float, float, float, kernels_entry_tag>& t) {
  backward_kernel<float>(threads, p, t.template with_isa<isa_tag>());
}

}  // namespace

}  // namespace ALIBI_CPU_ISA

extern const kernel_variant_table ALIBI_CAT(kernel_table_, ALIBI_CPU_ISA);
using layers = layer_ops<backend::eigen>;
const kernel_variant_table ALIBI_CAT(kernel_table_, ALIBI_CPU_ISA) = {
    &attention_kernel<float>,
    &attention_kernel<Eigen::half>,
    &attention_kernel<Eigen::bfloat16>,
    &merge_kernel<float>,
    &merge_kernel<double>,
    &backward_f32,
    &layers::linear<float>,
    &layers::layer_norm<float>,
    &layers::rms_norm<float>,
    &layers::linear_backward_input<float>,
    &layers::linear_backward_params<float>,
    &layers::activation_forward<float>,
    &layers::activation_backward<float>,
    &layers::layer_norm_backward<float>,
};

}  // namespace cpu
}  // namespace detail
}  // namespace alibi
