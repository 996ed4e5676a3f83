// SPDX-License-Identifier: MIT
// Internal to alibi::kernels: the table of one instruction-set variant's kernels. Each variant
// (src/eigen_kernels.cpp compiled with its own -march) defines one, named after its
// instruction set; the dispatcher (src/kernels_dispatch.cpp) calls through the selected one.
// The types carry no instruction set, so both sides name the same table type.
#pragma once

#include "alibi/attention.hpp"
#include "alibi/attention_backward.hpp"
#include "alibi/backend/eigen/layer_entries.hpp"
#include "alibi/core/half_types.hpp"
#include "alibi/merge.hpp"

namespace alibi {
namespace detail {
namespace cpu {

struct kernels_entry_tag;

template <class TKV>
using attention_entry = void (*)(int, const attention_problem&, const tensor_view<const float, 4>&,
                                 const tensor_view<const TKV, 4>&, const tensor_view<const TKV, 4>&,
                                 const tensor_view<float, 4>&, const tensor_view<const TKV, 5>&);
template <class T>
using merge_entry = void (*)(int, const partial_merge_args<T>&);
using backward_entry =
    void (*)(int, const attention_problem&,
             const attention_backward_tensors<float, float, float, float, kernels_entry_tag>&);

struct kernel_variant_table {
  attention_entry<float> attention_f32;
  attention_entry<Eigen::half> attention_f16;
  attention_entry<Eigen::bfloat16> attention_bf16;
  merge_entry<float> merge_f32;
  merge_entry<double> merge_f64;
  backward_entry backward_f32;
  // The layers' float operations (layer_entries.hpp).
  decltype(&kernels_entry::linear) linear;
  decltype(&kernels_entry::layer_norm) layer_norm;
  decltype(&kernels_entry::rms_norm) rms_norm;
  decltype(&kernels_entry::linear_backward_input) linear_backward_input;
  decltype(&kernels_entry::linear_backward_params) linear_backward_params;
  decltype(&kernels_entry::activation_forward) activation_forward;
  decltype(&kernels_entry::activation_backward) activation_backward;
  decltype(&kernels_entry::layer_norm_backward) layer_norm_backward;
};

}  // namespace cpu
}  // namespace detail
}  // namespace alibi
