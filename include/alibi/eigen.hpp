// SPDX-License-Identifier: MIT
// Adapters between alibi::tensor_view and Eigen::TensorMap<..., Eigen::RowMajor>, and the
// bias builder returning an Eigen tensor. The only core header that includes Eigen.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

#include "alibi/bias_matrix.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {

namespace detail {

/// A row-major (C order) view of rank R over `data` with Eigen's dimensions.
template <class T, int R, class Dims>
tensor_view<T, R> row_major_view(T* data, const Dims& dims) {
  tensor_view<T, R> v;
  v.data = data;
  index_t s = 1;
  for (int d = R - 1; d >= 0; --d) {
    v.extents[d] = static_cast<index_t>(dims[d]);
    v.strides[d] = s;
    s *= v.extents[d];
  }
  return v;
}

}  // namespace detail

/// A view of a row-major Eigen tensor (or TensorMap) of rank R.
template <class T, int R>
tensor_view<T, R> from_eigen(
    Eigen::TensorMap<Eigen::Tensor<std::remove_const_t<T>, R, Eigen::RowMajor>> m) {
  return detail::row_major_view<T, R>(m.data(), m.dimensions());
}

template <class T, int R>
tensor_view<T, R> from_eigen(Eigen::Tensor<T, R, Eigen::RowMajor>& t) {
  return detail::row_major_view<T, R>(t.data(), t.dimensions());
}

template <class T, int R>
tensor_view<const T, R> from_eigen(const Eigen::Tensor<T, R, Eigen::RowMajor>& t) {
  return detail::row_major_view<const T, R>(t.data(), t.dimensions());
}

/// The Eigen::TensorMap type over a view of T (const T maps a const tensor).
template <class T, int R>
using eigen_map_t = std::conditional_t<
    std::is_const<T>::value,
    Eigen::TensorMap<const Eigen::Tensor<std::remove_const_t<T>, R, Eigen::RowMajor>>,
    Eigen::TensorMap<Eigen::Tensor<T, R, Eigen::RowMajor>>>;

/// An Eigen::TensorMap over a view. TensorMap has no strides, so the view must be dense
/// row-major; anything else is an alibi::error.
template <class T, int R>
eigen_map_t<T, R> to_eigen(tensor_view<T, R> v) {
  index_t s = 1;
  for (int d = R - 1; d >= 0; --d) {
    if (v.extents[d] > 1 && v.strides[d] != s)
      detail::raise(error("alibi::to_eigen: the view must be dense row-major; stride(" +
                          std::to_string(d) + ") is " + std::to_string(v.strides[d]) +
                          ", expected " + std::to_string(s)));
    s *= v.extents[d];
  }
  Eigen::array<Eigen::Index, R> dims;
  for (int d = 0; d < R; ++d) dims[d] = static_cast<Eigen::Index>(v.extents[d]);
  return eigen_map_t<T, R>(v.data, dims);
}

/// The (heads, q_len, k_len) bias of batch entry 0 of `params` (see fill_bias): for a
/// single sequence, the matrix the seeds add to the scores.
inline Eigen::Tensor<float, 3, Eigen::RowMajor> bias_matrix(index_t heads, index_t q_len,
                                                            index_t k_len,
                                                            const attention_params& params = {}) {
  if (heads < 0 || q_len < 0 || k_len < 0)
    detail::raise(error("alibi::bias_matrix: heads, q_len and k_len must be >= 0, got " +
                        std::to_string(heads) + ", " + std::to_string(q_len) + ", " +
                        std::to_string(k_len)));
  Eigen::Tensor<float, 3, Eigen::RowMajor> t(heads, q_len, k_len);
  fill_bias(make_view(t.data(), index_t(1), heads, q_len, k_len), params);
  return t;
}

/// Sets parameter `name` of a module (multi_head_attention, transformer_layer) from an Eigen
/// matrix or vector of any storage order and scalar type: values by index, weight (out, in)
/// as in PyTorch. A vector sets a 1-D parameter; a wrong name or shape is an alibi::error.
template <class Module, class Derived>
void set_parameter(Module& module, const std::string& name,
                   const Eigen::DenseBase<Derived>& value) {
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const row_major m = value.derived().template cast<float>();
  std::vector<index_t> shape = {m.rows(), m.cols()};
  for (const auto& p : module.parameters())
    if (p.name == name && p.shape.size() == 1 && (m.rows() == 1 || m.cols() == 1))
      shape = {static_cast<index_t>(m.size())};
  module.set(name, m.data(), shape);
}

}  // namespace alibi
