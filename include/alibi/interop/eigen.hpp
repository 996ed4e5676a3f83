// SPDX-License-Identifier: MIT
// Adapters between alibi::tensor_view and Eigen: views of Eigen tensors (either storage order)
// and of token-per-row matrices, Eigen::TensorMaps over views, and the bias builder returning
// an Eigen tensor. The only core header that includes Eigen.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

#include "alibi/bias_matrix.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/core/view_checks.hpp"

namespace alibi {

namespace detail {

/// A view of rank R over `data` with Eigen's dimensions and Eigen's storage order: row-major
/// (the last index contiguous) or column-major (the first index contiguous, Eigen's default).
template <class T, int R, class Dims>
tensor_view<T, R> eigen_tensor_view(T* data, const Dims& dims, bool row_major) {
  tensor_view<T, R> v;
  v.data = data;
  index_t s = 1;
  for (int i = 0; i < R; ++i) {
    const int d = row_major ? R - 1 - i : i;
    v.extents[d] = static_cast<index_t>(dims[d]);
    v.strides[d] = s;
    s *= v.extents[d];
  }
  return v;
}

/// Whether an Eigen tensor type (Tensor, or the plain type of a TensorMap) is row-major.
template <class Plain>
constexpr bool eigen_row_major() {
  return static_cast<int>(Plain::Layout) == static_cast<int>(Eigen::RowMajor);
}

/// An error unless `v` is dense in the given storage order (extents of 1 take any stride).
/// `who` names the function in the message.
template <class T, int R>
void check_dense(const tensor_view<T, R>& v, bool row_major, const char* who) {
  // Extents >= 0, an element count and offsets in int64, data when not empty; an empty view
  // maps nothing, whatever its strides.
  check_view(who, "v", v).throw_if_failed();
  if (element_count(v) == 0) return;
  index_t s = 1;
  for (int i = 0; i < R; ++i) {
    const int d = row_major ? R - 1 - i : i;
    if (v.extents[d] > 1 && v.strides[d] != s) {
      std::string hint;
      if constexpr (R == 4) {
        if (row_major && v.strides[3] == 1 && v.strides[1] == v.extents[3] &&
            v.strides[2] == v.extents[1] * v.extents[3])
          hint =
              " (this is a view_bshd view: alibi::to_eigen_bshd maps it as (batch, seq, heads, "
              "dim))";
      }
      detail::raise(argument_error(std::string(who) + ": the view must be dense " +
                                   (row_major ? "row-major" : "column-major") + "; stride(" +
                                   std::to_string(d) + ") is " + std::to_string(v.strides[d]) +
                                   ", expected " + std::to_string(s) + hint));
    }
    s *= v.extents[d];
  }
}

}  // namespace detail

/// A view of an Eigen tensor of rank R in either storage order: a row-major tensor gives a
/// dense row-major view, a column-major one (Eigen's default) a view whose first index is
/// contiguous. Indices mean the same in the view and the tensor. Attention needs the head
/// dimension (the last index) contiguous, so pass it row-major tensors.
template <class T, int R, int Options, class IndexType>
tensor_view<T, R> from_eigen(Eigen::Tensor<T, R, Options, IndexType>& t) {
  using plain = Eigen::Tensor<T, R, Options, IndexType>;
  return detail::eigen_tensor_view<T, R>(t.data(), t.dimensions(),
                                         detail::eigen_row_major<plain>());
}

template <class T, int R, int Options, class IndexType>
tensor_view<const T, R> from_eigen(const Eigen::Tensor<T, R, Options, IndexType>& t) {
  using plain = Eigen::Tensor<T, R, Options, IndexType>;
  return detail::eigen_tensor_view<const T, R>(t.data(), t.dimensions(),
                                               detail::eigen_row_major<plain>());
}

/// A temporary tensor would leave the view dangling.
template <class T, int R, int Options, class IndexType>
void from_eigen(Eigen::Tensor<T, R, Options, IndexType>&& t) = delete;

/// A view of an Eigen::TensorMap (of a Tensor or a const Tensor; either storage order): the
/// element type, rank and layout come from the map's type.
template <class Plain, int MapOptions, template <class> class MakePointer>
auto from_eigen(const Eigen::TensorMap<Plain, MapOptions, MakePointer>& m) {
  using plain = std::remove_const_t<Plain>;
  using scalar = typename plain::Scalar;
  using T = std::conditional_t<std::is_const<Plain>::value, const scalar, scalar>;
  constexpr int R = static_cast<int>(plain::NumIndices);
  return detail::eigen_tensor_view<T, R>(m.data(), m.dimensions(),
                                         detail::eigen_row_major<plain>());
}

/// The Eigen::TensorMap type over a view of T (const T maps a const tensor).
template <class T, int R, int Layout = Eigen::RowMajor>
using eigen_map_t =
    std::conditional_t<std::is_const<T>::value,
                       Eigen::TensorMap<const Eigen::Tensor<std::remove_const_t<T>, R, Layout>>,
                       Eigen::TensorMap<Eigen::Tensor<T, R, Layout>>>;

/// An Eigen::TensorMap over a view, with the view's indices. TensorMap has no strides, so the
/// view must be dense in the map's storage order: row-major by default, column-major with
/// to_eigen<Eigen::ColMajor>(v). Anything else is an alibi::error; for a view_bshd view use
/// to_eigen_bshd.
template <int Layout = Eigen::RowMajor, class T, int R>
eigen_map_t<T, R, Layout> to_eigen(tensor_view<T, R> v) {
  static_assert(Layout == Eigen::RowMajor || Layout == Eigen::ColMajor,
                "alibi::to_eigen: Layout must be Eigen::RowMajor or Eigen::ColMajor");
  detail::check_dense(v, Layout == Eigen::RowMajor, "alibi::to_eigen");
  Eigen::array<Eigen::Index, R> dims;
  for (int d = 0; d < R; ++d) dims[d] = static_cast<Eigen::Index>(v.extents[d]);
  return eigen_map_t<T, R, Layout>(v.data, dims);
}

/// The inverse of view_bshd: a row-major (batch, seq, heads, head_dim) Eigen::TensorMap over
/// the memory of a (batch, heads, seq, head_dim) view of dense (batch, seq, heads, head_dim)
/// memory, e.g. the output of attention written through view_bshd.
template <class T>
eigen_map_t<T, 4> to_eigen_bshd(tensor_view<T, 4> v) {
  const tensor_view<T, 4> m = make_strided_view<T, 4>(
      v.data, {v.extents[0], v.extents[2], v.extents[1], v.extents[3]},
      {v.strides[0], v.strides[2], v.strides[1], v.strides[3]});  // (batch, seq, heads, dim)
  detail::check_view("alibi::to_eigen_bshd", "v (as batch, seq, heads, dim)", m).throw_if_failed();
  index_t s = 1;
  const char* names[4] = {"batch", "seq", "heads", "head_dim"};
  for (int d = 3; d >= 0 && detail::element_count(m) > 0; --d) {
    if (m.extents[d] > 1 && m.strides[d] != s)
      detail::raise(
          argument_error("alibi::to_eigen_bshd: the view must cover dense (batch, seq, heads, "
                         "head_dim) memory as view_bshd makes it; the " +
                         std::string(names[d]) + " stride is " + std::to_string(m.strides[d]) +
                         ", expected " + std::to_string(s)));
    s *= m.extents[d];
  }
  Eigen::array<Eigen::Index, 4> dims;
  for (int d = 0; d < 4; ++d) dims[d] = static_cast<Eigen::Index>(m.extents[d]);
  return eigen_map_t<T, 4>(v.data, dims);
}

/// A (batch, heads, seq, head_dim) view of an Eigen matrix that holds one token per row:
/// batch * seq rows (sequence b's tokens in rows b * seq ..) and heads * head_dim columns, the
/// layout a projection `X * W.transpose()` produces. The matrix may be a Matrix, Map, Ref or
/// Block (e.g. the query columns of a fused QKV matrix): its outer stride is used. It must be
/// row-major, so that head_dim is contiguous; a column-major matrix is refused at compile
/// time (one with a token per column: pass m.transpose()). A const matrix gives a const view.
template <class M, class Matrix = std::decay_t<M>,
          class = std::enable_if_t<std::is_base_of<Eigen::MatrixBase<Matrix>, Matrix>::value>>
auto view_bshd(M&& m, index_t batch, index_t seq, index_t heads, index_t head_dim) {
  static_assert((static_cast<unsigned>(Matrix::Flags) & Eigen::DirectAccessBit) != 0,
                "alibi::view_bshd: the Eigen expression has no memory of its own; pass a "
                "Matrix, Map, Ref or Block, or evaluate the expression into a matrix first");
  static_assert(static_cast<bool>(Matrix::IsRowMajor),
                "alibi::view_bshd: the matrix must be row-major (Eigen::RowMajor), one token "
                "per row, so that head_dim is contiguous. Eigen matrices are column-major by "
                "default: declare it Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, "
                "Eigen::RowMajor>, or pass m.transpose() if each column holds one token");
  static_assert(!(std::is_rvalue_reference<M&&>::value &&
                  std::is_base_of<Eigen::PlainObjectBase<Matrix>, Matrix>::value),
                "alibi::view_bshd: a temporary matrix would leave the view dangling");
  using T = std::remove_pointer_t<decltype(m.data())>;
  if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0)
    detail::raise(
        argument_error("alibi::view_bshd: batch, seq, heads and head_dim must be >= 0, got " +
                       std::to_string(batch) + ", " + std::to_string(seq) + ", " +
                       std::to_string(heads) + ", " + std::to_string(head_dim)));
  index_t rows = 0, cols = 0, seq_stride = 0;
  const index_t ld = static_cast<index_t>(m.outerStride());
  if (__builtin_mul_overflow(batch, seq, &rows) || __builtin_mul_overflow(heads, head_dim, &cols) ||
      __builtin_mul_overflow(seq, ld, &seq_stride) || rows != static_cast<index_t>(m.rows()) ||
      cols != static_cast<index_t>(m.cols()))
    detail::raise(argument_error(
        "alibi::view_bshd: the matrix must have batch * seq = " + std::to_string(batch) + " * " +
        std::to_string(seq) + " rows (one token per row) and heads * head_dim = " +
        std::to_string(heads) + " * " + std::to_string(head_dim) + " columns; got " +
        std::to_string(m.rows()) + " x " + std::to_string(m.cols())));
  if (m.cols() > 1 && m.innerStride() != 1)
    detail::raise(
        argument_error("alibi::view_bshd: the matrix's inner stride must be 1 (head_dim "
                       "contiguous), got " +
                       std::to_string(m.innerStride())));
  return make_strided_view<T, 4>(m.data(), {batch, heads, seq, head_dim},
                                 {seq_stride, head_dim, ld, 1});
}

/// The (heads, q_len, k_len) bias of one sequence (see fill_bias, with batch 1: per-batch
/// views in `params`, such as lengths, offsets or caller slopes, have extent 1), the matrix
/// the seeds add to the scores.
inline Eigen::Tensor<float, 3, Eigen::RowMajor> bias_matrix(index_t heads, index_t q_len,
                                                            index_t k_len,
                                                            const attention_params& params = {}) {
  if (heads < 0 || q_len < 0 || k_len < 0)
    detail::raise(argument_error("alibi::bias_matrix: heads, q_len and k_len must be >= 0, got " +
                                 std::to_string(heads) + ", " + std::to_string(q_len) + ", " +
                                 std::to_string(k_len)));
  // Checked before Eigen allocates: a wrapped product would allocate too little, and a huge
  // one would be std::bad_alloc instead of an error naming the arguments. A zero extent
  // makes the count 0 whatever the others are.
  if (detail::checked_product({heads, q_len, k_len, static_cast<index_t>(sizeof(float))}) < 0)
    detail::raise(argument_error("alibi::bias_matrix: heads * q_len * k_len (" +
                                 std::to_string(heads) + " * " + std::to_string(q_len) + " * " +
                                 std::to_string(k_len) +
                                 ") floats must fit in 64-bit byte offsets"));
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
