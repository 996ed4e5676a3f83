// SPDX-License-Identifier: MIT
// tensor_view<T, Rank>: a non-owning strided view with 64-bit extents and strides.
// Trivially copyable, so it is passed by value into CUDA kernels unchanged.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "alibi/core/config.hpp"

namespace alibi {

using index_t = std::int64_t;

namespace detail {
/// The product of the non-negative factors in [first, last), or -1 when a factor is
/// negative or the product does not fit in int64 (a zero factor makes it 0, however large the
/// others): sizes computed from user arguments go through here, since a wrapped one would
/// allocate too little (or throw std::bad_alloc instead of naming the argument).
template <class It>
index_t checked_product(It first, It last) {
  bool zero = false;
  for (It f = first; f != last; ++f) {
    if (*f < 0) return -1;
    zero = zero || *f == 0;
  }
  if (zero) return 0;
  index_t n = 1;
  for (It f = first; f != last; ++f)
    if (__builtin_mul_overflow(n, static_cast<index_t>(*f), &n)) return -1;
  return n;
}
inline index_t checked_product(std::initializer_list<index_t> factors) {
  return checked_product(factors.begin(), factors.end());
}
}  // namespace detail

template <class T, int Rank>
struct tensor_view {
  static_assert(Rank >= 1, "alibi::tensor_view: Rank must be at least 1");
  using value_type = T;
  static constexpr int rank = Rank;

  T* data = nullptr;
  index_t extents[Rank] = {};
  index_t strides[Rank] = {};  // in elements, not bytes

  ALIBI_HOST_DEVICE constexpr index_t extent(int d) const { return extents[d]; }
  ALIBI_HOST_DEVICE constexpr index_t stride(int d) const { return strides[d]; }
  ALIBI_HOST_DEVICE constexpr bool empty_data() const { return data == nullptr; }

  /// Number of elements (product of extents). Views the front end accepted have a count
  /// that fits in int64 (detail::element_count checks it); an extent of 0 gives 0 before
  /// anything is multiplied, so huge extents beside a zero one never overflow.
  ALIBI_HOST_DEVICE constexpr index_t size() const {
    for (int d = 0; d < Rank; ++d)
      if (extents[d] == 0) return 0;
    index_t n = 1;
    for (int d = 0; d < Rank; ++d) n *= extents[d];
    return n;
  }

  template <class... I>
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE T& operator()(I... idx) const {
    static_assert(sizeof...(I) == Rank, "alibi::tensor_view: wrong number of indices");
    const index_t ii[] = {static_cast<index_t>(idx)...};
    index_t off = 0;
    for (int d = 0; d < Rank; ++d) off += ii[d] * strides[d];
    return data[off];
  }

  /// Pointer to the element at the given leading indices (the remaining ones zero).
  template <class... I>
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE T* ptr(I... idx) const {
    static_assert(sizeof...(I) <= Rank, "alibi::tensor_view: too many indices");
    const index_t ii[] = {static_cast<index_t>(idx)..., 0};
    index_t off = 0;
    for (int d = 0; d < static_cast<int>(sizeof...(I)); ++d) off += ii[d] * strides[d];
    return data + off;
  }

  /// A view of the same memory with read-only elements: T -> const T only. U is deduced
  /// from the target, so it must be T itself; any other element type has no conversion
  /// (a double view does not become a float one).
  template <class U = T,
            std::enable_if_t<std::is_same<U, T>::value && !std::is_const<U>::value, int> = 0>
  ALIBI_HOST_DEVICE constexpr operator tensor_view<const U, Rank>() const {
    tensor_view<const T, Rank> v;
    v.data = data;
    for (int d = 0; d < Rank; ++d) {
      v.extents[d] = extents[d];
      v.strides[d] = strides[d];
    }
    return v;
  }
};

static_assert(std::is_trivially_copyable<tensor_view<float, 4>>::value,
              "tensor_view must stay trivially copyable (it is a kernel argument)");

/// A row-major (C order) view: the last index is contiguous.
template <class T, class... E>
constexpr tensor_view<T, static_cast<int>(sizeof...(E))> make_view(T* data, E... extents) {
  constexpr int rank = static_cast<int>(sizeof...(E));
  tensor_view<T, rank> v;
  v.data = data;
  const index_t ext[] = {static_cast<index_t>(extents)...};
  // Too many elements for int64 saturate the strides, which the front end then refuses
  // (rather than wrapping: signed overflow is undefined).
  index_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    v.extents[d] = ext[d];
    v.strides[d] = s;
    if (d > 0 && __builtin_mul_overflow(s, ext[d], &s)) s = INT64_MAX;
  }
  return v;
}

/// A view with explicit extents and strides (in elements).
template <class T, int Rank>
constexpr tensor_view<T, Rank> make_strided_view(T* data, const index_t (&extents)[Rank],
                                                 const index_t (&strides)[Rank]) {
  tensor_view<T, Rank> v;
  v.data = data;
  for (int d = 0; d < Rank; ++d) {
    v.extents[d] = extents[d];
    v.strides[d] = strides[d];
  }
  return v;
}

/// Attention tensors are viewed as (batch, heads, seq, head_dim). This makes that view
/// over memory laid out as (batch, seq, heads, head_dim), the layout a fused QKV
/// projection produces, without copying.
template <class T>
constexpr tensor_view<T, 4> view_bshd(T* data, index_t batch, index_t seq, index_t heads,
                                      index_t head_dim) {
  return make_strided_view<T, 4>(data, {batch, heads, seq, head_dim},
                                 {seq * heads * head_dim, head_dim, heads * head_dim, 1});
}

/// (batch, heads, seq, head_dim) view over memory in that same order.
template <class T>
constexpr tensor_view<T, 4> view_bhsd(T* data, index_t batch, index_t heads, index_t seq,
                                      index_t head_dim) {
  return make_view(data, batch, heads, seq, head_dim);
}

}  // namespace alibi
