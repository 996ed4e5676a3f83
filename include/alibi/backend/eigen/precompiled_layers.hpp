// SPDX-License-Identifier: MIT
// Included by <alibi/backend/eigen/layers.hpp> when ALIBI_PRECOMPILED_KERNELS is defined (the
// target links alibi::kernels): the layers' float operations on the eigen backend (the
// projections' GEMMs, the norms, the activations and their backward passes) are calls to the
// library, which holds them compiled for each of its instruction-set variants, as it holds
// the attention kernels. Other element types compile the host operations in the caller's file.
#pragma once

#ifndef ALIBI_PRECOMPILED_KERNELS
#error \
    "alibi/backend/eigen/precompiled_layers.hpp belongs to alibi::kernels: include <alibi/backend/eigen/layers.hpp> and link alibi::kernels (which defines ALIBI_PRECOMPILED_KERNELS)"
#endif

#include <type_traits>

#include "alibi/backend/eigen/key_norms.hpp"
#include "alibi/backend/eigen/layer_entries.hpp"
#include "alibi/backend/host/layers.hpp"
#include "alibi/core/backends.hpp"
#include "alibi/core/config.hpp"
#include "alibi/layer_config.hpp"

namespace alibi {
namespace detail {

/// The host operations, with the float ones that hold GEMMs or per-element math taken from
/// alibi::kernels. Each forwarder hides the host operation of the same name.
struct precompiled_layer_ops : host_layer_ops<backend::eigen, eigen_key_norms> {
  using host = host_layer_ops<backend::eigen, eigen_key_norms>;

  template <class T>
  static void linear(const backend::eigen& be, const T* x, index_t ldx, index_t rows, index_t in,
                     const T* w, const T* bias, index_t out, T* y, index_t ldy, bool accumulate,
                     const activation* act) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::linear(be, x, ldx, rows, in, w, bias, out, y, ldy, accumulate, act);
    else
      host::linear(be, x, ldx, rows, in, w, bias, out, y, ldy, accumulate, act);
  }
  template <class T>
  static void layer_norm(const backend::eigen& be, const T* x, index_t ldx, T* y, index_t ldy,
                         index_t rows, index_t n, const T* gamma, const T* beta, float eps) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps);
    else
      host::layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps);
  }
  template <class T>
  static void rms_norm(const backend::eigen& be, const T* x, index_t ldx, T* y, index_t ldy,
                       index_t rows, index_t n, const T* gamma, float eps) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::rms_norm(be, x, ldx, y, ldy, rows, n, gamma, eps);
    else
      host::rms_norm(be, x, ldx, y, ldy, rows, n, gamma, eps);
  }
  template <class T>
  static void linear_backward_input(const backend::eigen& be, const T* dy, index_t lddy,
                                    index_t rows, index_t out, const T* w, index_t in, T* dx,
                                    index_t lddx, bool accumulate) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::linear_backward_input(be, dy, lddy, rows, out, w, in, dx, lddx,
                                                accumulate);
    else
      host::linear_backward_input(be, dy, lddy, rows, out, w, in, dx, lddx, accumulate);
  }
  template <class T>
  static void linear_backward_params(const backend::eigen& be, const T* dy, index_t lddy,
                                     index_t rows, index_t out, const T* x, index_t ldx, index_t in,
                                     T* dw, T* db) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::linear_backward_params(be, dy, lddy, rows, out, x, ldx, in, dw, db);
    else
      host::linear_backward_params(be, dy, lddy, rows, out, x, ldx, in, dw, db);
  }
  template <class T>
  static void activation_forward(const backend::eigen& be, const T* x, index_t ldx, T* y,
                                 index_t ldy, index_t rows, index_t cols, activation act) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::activation_forward(be, x, ldx, y, ldy, rows, cols, act);
    else
      host::activation_forward(be, x, ldx, y, ldy, rows, cols, act);
  }
  template <class T>
  static void activation_backward(const backend::eigen& be, const T* x, index_t ldx, T* dh,
                                  index_t ldh, index_t rows, index_t cols, activation act) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::activation_backward(be, x, ldx, dh, ldh, rows, cols, act);
    else
      host::activation_backward(be, x, ldx, dh, ldh, rows, cols, act);
  }
  template <class T>
  static void layer_norm_backward(const backend::eigen& be, norm_type kind, const T* x, index_t ldx,
                                  const T* dy, index_t lddy, index_t rows, index_t n,
                                  const T* gamma, float eps, T* dx, index_t lddx, bool accumulate,
                                  T* dgamma, T* dbeta) {
    if constexpr (std::is_same<T, float>::value)
      cpu::kernels_entry::layer_norm_backward(be, kind, x, ldx, dy, lddy, rows, n, gamma, eps, dx,
                                              lddx, accumulate, dgamma, dbeta);
    else
      host::layer_norm_backward(be, kind, x, ldx, dy, lddy, rows, n, gamma, eps, dx, lddx,
                                accumulate, dgamma, dbeta);
  }
};

template <>
struct layer_ops<backend::eigen> : precompiled_layer_ops {};

}  // namespace detail
}  // namespace alibi
