// SPDX-License-Identifier: MIT
// Internal to alibi::kernels: the entry points of the layers' float operations on the eigen
// backend, defined by the library's dispatcher (src/kernels_dispatch.cpp), with the signatures
// of host_layer_ops. precompiled_layers.hpp calls them; the dispatcher's table of each
// instruction-set variant (src/kernel_variant.hpp) is typed after them.
#pragma once

#include "alibi/core/backends.hpp"
#include "alibi/core/config.hpp"
#include "alibi/layer_config.hpp"

namespace alibi {
namespace detail {
namespace cpu {

/// The dispatcher's entry points for the layer operations (src/kernels_dispatch.cpp), with
/// host_layer_ops' float signatures: each calls the selected variant.
namespace kernels_entry {
void linear(const backend::eigen& be, const float* x, index_t ldx, index_t rows, index_t in,
            const float* w, const float* bias, index_t out, float* y, index_t ldy, bool accumulate,
            const activation* act);
void layer_norm(const backend::eigen& be, const float* x, index_t ldx, float* y, index_t ldy,
                index_t rows, index_t n, const float* gamma, const float* beta, float eps);
void rms_norm(const backend::eigen& be, const float* x, index_t ldx, float* y, index_t ldy,
              index_t rows, index_t n, const float* gamma, float eps);
void linear_backward_input(const backend::eigen& be, const float* dy, index_t lddy, index_t rows,
                           index_t out, const float* w, index_t in, float* dx, index_t lddx,
                           bool accumulate);
void linear_backward_params(const backend::eigen& be, const float* dy, index_t lddy, index_t rows,
                            index_t out, const float* x, index_t ldx, index_t in, float* dw,
                            float* db);
void activation_forward(const backend::eigen& be, const float* x, index_t ldx, float* y,
                        index_t ldy, index_t rows, index_t cols, activation act);
void activation_backward(const backend::eigen& be, const float* x, index_t ldx, float* dh,
                         index_t ldh, index_t rows, index_t cols, activation act);
void layer_norm_backward(const backend::eigen& be, norm_type kind, const float* x, index_t ldx,
                         const float* dy, index_t lddy, index_t rows, index_t n, const float* gamma,
                         float eps, float* dx, index_t lddx, bool accumulate, float* dgamma,
                         float* dbeta);
}  // namespace kernels_entry

}  // namespace cpu
}  // namespace detail
}  // namespace alibi
