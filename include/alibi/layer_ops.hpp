// SPDX-License-Identifier: MIT
// What the layers need besides attention: the layer_ops<Backend> primary (one
// specialization per backend, in that backend's folder: layers.hpp), and the shared helpers
// of the modules (timing, row blocks, host lengths, the parameter table).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/core/view_checks.hpp"
#include "alibi/layer_config.hpp"

namespace alibi {

namespace detail {

/// The operations the modules need besides attention, one specialization per backend.
/// Matrices are row-major with a row stride (ld); pointers are in the backend's memory.
///   template <class T> using buffer = ...;       // owning storage: data(), size()
///   upload(be, const std::vector<T>& host, buffer<T>& dst)     dst = host (resized)
///   download(be, const buffer<T>&) -> std::vector<T>
///   resize(buffer<T>&, index_t n)                 grows; contents unspecified
///   linear(be, x, ldx, rows, in, w, bias, out, y, ldy, accumulate, const activation* act)
///       y (rows, out) = act(x (rows, in) w (out, in)^T + bias), or y += x w^T + bias when
///       accumulate (act is then null); bias may be null
///   layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps)   y may be x; beta may be null
///   rms_norm(be, x, ldx, y, ldy, rows, n, gamma, eps)          y may be x
///   multiply(be, a, lda, b, ldb, rows, cols)      a *= b element-wise
///   copy_rows(be, src, lds, dst, ldd, rows, cols), zero_rows(be, dst, ld, rows, cols)
///   stage_rows(be, src, lds, dst, ldd, rows, cols)  backends outside host memory only: rows
///       between host memory and the backend's, either way (alibi::mpi's host staging)
///   per_batch(be, const std::vector<index_t>&, buffer<index_t>& scratch) and
///   key_mask(be, host (batch, k_len) view, buffer<bool>& scratch): the views attention()
///       reads for this backend (host memory, or a copy in device memory)
///   fence(be)                                     waits for queued work (timings, staging)
template <class Backend, class Enable = void>
struct layer_ops {
  static_assert(dependent_false<Backend>::value,
                "alibi layers: no layer operations for this backend are visible. Include the "
                "backend's <alibi/backend/NAME/layers.hpp> (or the umbrella <alibi/alibi.hpp> "
                "for the CPU backends, <alibi/cuda.cuh> in a .cu file for CUDA).");
};

/// Owning storage of U in a backend's memory (what the modules keep their weights,
/// caches and workspaces in).
template <class Backend, class U>
using backend_buffer = typename layer_ops<Backend>::template buffer<U>;

/// The attention part of a module's configuration.
inline const mha_config& attention_config(const mha_config& c) { return c; }
inline const mha_config& attention_config(const layer_config& c) { return c.attention; }

/// Times one part of a forward call into `slot` when timings were asked for.
template <class Ops, class Backend, class F>
void timed(const Backend& be, double* slot, F&& f) {
  if (slot == nullptr) {
    f();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Ops::fence(be);
  *slot += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Rows of a (batch, seq, features) view collapse to one (batch * seq, features) matrix with
/// row stride `ld` when the feature dimension is contiguous and batch stride = seq * ld.
template <class T>
index_t row_stride(const char* fn, const char* name, const tensor_view<T, 3>& x, index_t features) {
  const std::string f = fn;
  if (x.extents[2] != features)
    detail::raise(argument_error(f + ": " + name + ".extent(2) must be " + str(features) +
                                 " (features), got " + str(x.extents[2])));
  // Negative extents would make size() positive (-2 * -3) while the view addresses nothing.
  if (detail::checked_product({x.extents[0], x.extents[1], x.extents[2]}) < 0)
    detail::raise(argument_error(f + ": " + name + "'s extents must be >= 0 with a product that " +
                                 "fits in int64, got (" + str(x.extents[0]) + ", " +
                                 str(x.extents[1]) + ", " + str(x.extents[2]) + ")"));
  if (x.size() > 0 && x.data == nullptr)
    detail::raise(argument_error(f + ": " + name + ".data is null"));
  if (x.extents[2] > 1 && x.strides[2] != 1)
    detail::raise(argument_error(
        f + ": " + name + ".stride(2) must be 1 (contiguous features), got " + str(x.strides[2])));
  // An empty view addresses no row: any stride of its own is fine (a row-major (2, 0, E)
  // view has stride(0) = 0).
  if (x.extents[0] == 0 || x.extents[1] == 0) return features;
  // One row per sequence (decoding): the rows are spaced by the batch stride.
  const index_t ld = x.extents[1] > 1 ? x.strides[1] : x.extents[0] > 1 ? x.strides[0] : features;
  if (ld < features)
    detail::raise(argument_error(f + ": " + name +
                                 "'s row stride (stride(1), or stride(0) when extent(1) " +
                                 "is 1) must be >= " + str(features) + ", got " + str(ld)));
  const index_t batch_stride = detail::checked_product({x.extents[1], ld});
  if (x.extents[0] > 1 && x.extents[1] > 1 && (batch_stride < 0 || x.strides[0] != batch_stride))
    detail::raise(
        argument_error(f + ": " + name + ".stride(0) must be extent(1) * stride(1) = " +
                       (batch_stride < 0 ? std::string("(beyond int64)") : str(batch_stride)) +
                       " (rows of every batch entry evenly spaced), got " + str(x.strides[0])));
  return ld;
}

/// Host copy of optional per-batch lengths, checked against [0, limit].
inline std::vector<index_t> host_lengths(const char* fn, const char* name,
                                         tensor_view<const index_t, 1> v, index_t batch,
                                         index_t limit) {
  const std::string f = fn;
  std::vector<index_t> out(static_cast<std::size_t>(batch), limit);
  if (v.data == nullptr) {
    if (v.extents[0] != 0)
      detail::raise(argument_error(f + ": " + name + ".data is null but it has " +
                                   str(v.extents[0]) +
                                   " elements; leave it default-constructed to omit it"));
    return out;
  }
  if (v.extents[0] != batch)
    detail::raise(argument_error(f + ": " + name + " must have one entry per batch entry (" +
                                 str(batch) + "), got " + str(v.extents[0])));
  for (index_t b = 0; b < batch; ++b) {
    const index_t n = v(b);
    if (n < 0 || n > limit)
      detail::raise(argument_error(f + ": " + name + "(" + str(b) + ") must be in [0, " +
                                   str(limit) + "], got " + str(n)));
    out[static_cast<std::size_t>(b)] = n;
  }
  return out;
}

inline std::string shape_text(const std::vector<index_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + ")";
}

/// The extents of a view, as parameter shapes are written.
template <class U, int R>
std::vector<index_t> extents_of(const tensor_view<U, R>& v) {
  return std::vector<index_t>(v.extents, v.extents + R);
}

/// A host view's elements in row-major order (any strides), for parameter `name` of module
/// function `fn`.
template <int R>
std::vector<float> gather(const char* fn, const std::string& name,
                          const tensor_view<const float, R>& v) {
  // Negative extents, offsets past 64 bits and null data with elements are refused before
  // the buffer is sized from them.
  check_view(fn, name.c_str(), v).throw_if_failed();
  std::vector<float> out(static_cast<std::size_t>(v.size()));
  if (out.empty()) return out;
  index_t idx[R] = {};
  for (float& x : out) {
    index_t off = 0;
    for (int d = 0; d < R; ++d) off += idx[d] * v.strides[d];
    x = v.data[off];
    for (int d = R - 1; d >= 0 && ++idx[d] == v.extents[d]; --d) idx[d] = 0;
  }
  return out;
}

/// Sets rows [lengths(b), seq) of every batch entry of a (batch, seq, cols) row block to 0.
template <class Ops, class Backend, class T>
void zero_padded_rows(const Backend& be, T* data, index_t ld, index_t seq, index_t cols,
                      const std::vector<index_t>& lengths) {
  for (std::size_t b = 0; b < lengths.size(); ++b)
    if (lengths[b] < seq)
      Ops::zero_rows(be, data + (static_cast<index_t>(b) * seq + lengths[b]) * ld, ld,
                     seq - lengths[b], cols);
}

/// Zeroes the rows (b, i), i >= q_len[b], that key_mask (batch, seq) excludes: a padded query
/// that is also an excluded key is read by no output, and a NaN there would still reach the
/// weight gradients as 0 x NaN. A mask of another shape is left to the attention's check.
template <class Ops, class Backend, class T>
void zero_masked_padding(const Backend& be, T* data, index_t ld, index_t seq, index_t cols,
                         const std::vector<index_t>& q_len, tensor_view<const bool, 2> key_mask) {
  if (key_mask.data == nullptr || key_mask.extents[0] != static_cast<index_t>(q_len.size()) ||
      key_mask.extents[1] != seq)
    return;
  for (std::size_t b = 0; b < q_len.size(); ++b)
    for (index_t i = q_len[b]; i < seq; ++i)
      if (key_mask(static_cast<index_t>(b), i))
        Ops::zero_rows(be, data + (static_cast<index_t>(b) * seq + i) * ld, ld, 1, cols);
}

/// y (rows, n) = the norm `kind` of x (row strides ldx, ldy; y may be x) with gain gamma and,
/// for LayerNorm when not null, bias beta.
template <class Ops, class Backend, class T>
void apply_norm(const Backend& be, norm_type kind, const T* x, index_t ldx, T* y, index_t ldy,
                index_t rows, index_t n, const T* gamma, const T* beta, float eps) {
  if (kind == norm_type::rms_norm)
    Ops::rms_norm(be, x, ldx, y, ldy, rows, n, gamma, eps);
  else
    Ops::layer_norm(be, x, ldx, y, ldy, rows, n, gamma, beta, eps);
}

/// The named parameters of a module (Owner): for each, its shape, its initial value and the
/// Owner member that stores it. Allocation, listing, set and get for every module.
template <class Owner, class T, class Backend>
struct parameter_table {
  using ops = layer_ops<Backend>;
  using buffer_type = typename ops::template buffer<T>;
  using member_pointer = buffer_type Owner::*;
  struct slot {
    std::string name;
    std::vector<index_t> shape;
    member_pointer member;
    float initial = 0.0f;
  };
  const char* owner = "";
  std::vector<slot> slots;

  static index_t count(const std::vector<index_t>& shape) {
    index_t n = 1;
    for (index_t e : shape) n *= e;
    return n;
  }
  /// Stores every parameter, filled with its initial value. Every shape is checked first:
  /// its bytes must fit in 64 bits (an impossible configuration is an alibi::error naming
  /// the parameter, never a wrapped size); memory that cannot be had is std::bad_alloc.
  void allocate(Owner& o, const Backend& be) const {
    for (const slot& s : slots) {
      const index_t n = detail::checked_product(s.shape.begin(), s.shape.end());
      if (n < 0 || detail::checked_product({n, static_cast<index_t>(sizeof(T))}) < 0)
        detail::raise(argument_error(
            std::string(owner) + ": parameter '" + s.name + "' of shape " + shape_text(s.shape) +
            " has more bytes than 64-bit sizes hold; check the configuration"));
    }
    for (const slot& s : slots)
      ops::upload(be, std::vector<T>(static_cast<std::size_t>(count(s.shape)), T(s.initial)),
                  o.*s.member);
  }
  void list(std::vector<parameter_info>& out, const std::string& prefix = "") const {
    for (const slot& s : slots) out.push_back({prefix + s.name, s.shape});
  }
  /// The slot called `name`, or an alibi::error listing the parameters there are.
  const slot& find(const std::string& name, const char* fn) const {
    for (const slot& s : slots)
      if (s.name == name) return s;
    std::string known;
    for (const slot& s : slots) known += (known.empty() ? "" : ", ") + s.name;
    detail::raise(argument_error(std::string(owner) + "::" + fn + ": no parameter named '" + name +
                                 "'; parameters: " + known));
  }
  /// Checks the shape, converts the host floats to T and uploads them.
  void set(Owner& o, const Backend& be, const std::string& name, const float* data,
           const std::vector<index_t>& shape) const {
    const slot& s = find(name, "set");
    if (shape != s.shape)
      detail::raise(argument_error("alibi: parameter '" + name + "' must have shape " +
                                   shape_text(s.shape) + ", got " + shape_text(shape)));
    const index_t n = count(shape);
    if (n > 0 && data == nullptr)
      detail::raise(argument_error("alibi: parameter '" + name + "': data is null"));
    std::vector<T> converted(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) converted[static_cast<std::size_t>(i)] = T(data[i]);
    ops::upload(be, converted, o.*s.member);
  }
  /// The parameter's values as float, row-major (host).
  std::vector<float> get(const Owner& o, const Backend& be, const std::string& name) const {
    const std::vector<T> stored = ops::download(be, o.*find(name, "get").member);
    std::vector<float> out(stored.size());
    for (std::size_t i = 0; i < stored.size(); ++i) out[i] = static_cast<float>(stored[i]);
    return out;
  }
};

}  // namespace detail

}  // namespace alibi
