// SPDX-License-Identifier: MIT
// The front end's checks of one view (extents, element count, offsets, self-overlap) and of
// two views at once (an output that shares memory with another argument).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {

inline std::string str(index_t v) { return std::to_string(v); }

/// Largest element offset a view can reach, or -1 if it does not fit in int64.
template <class T, int R>
index_t max_offset(const tensor_view<T, R>& v) {
  index_t off = 0;
  for (int d = 0; d < R; ++d) {
    if (v.extents[d] == 0) return 0;
    if (v.extents[d] == 1) continue;                                     // its stride is never used
    if (v.strides[d] == std::numeric_limits<index_t>::min()) return -1;  // |stride| overflows
    const index_t s = v.strides[d] < 0 ? -v.strides[d] : v.strides[d];
    index_t term = 0;
    if (__builtin_mul_overflow(v.extents[d] - 1, s, &term)) return -1;
    if (__builtin_add_overflow(off, term, &off)) return -1;
  }
  return off;
}

/// The number of elements of a view (extents non-negative), or -1 if it does not fit in
/// int64. tensor_view::size() stays a plain product (usable on the device); the front end
/// checks with this first, so that size() never overflows on a view it accepted.
template <class T, int R>
index_t element_count(const tensor_view<T, R>& v) {
  return detail::checked_product(v.extents, v.extents + R);
}

/// Checks one view: sizes non-negative, element count and offsets in int64, data present
/// when non-empty.
template <class T, int R>
status check_view(const char* fn, const char* name, const tensor_view<T, R>& v) {
  for (int d = 0; d < R; ++d)
    if (v.extents[d] < 0)
      return status::failure(std::string(fn) + ": " + name + ".extent(" + str(d) +
                             ") must be >= 0, got " + str(v.extents[d]));
  const index_t n = element_count(v);
  if (n < 0)
    return status::failure(std::string(fn) + ": " + name +
                           "'s element count (the product of its extents) must fit in a "
                           "64-bit integer");
  if (n > 0 && v.data == nullptr)
    return status::failure(std::string(fn) + ": " + name + ".data is null but " + name + " has " +
                           str(n) + " elements");
  if (max_offset(v) < 0)
    return status::failure(std::string(fn) + ": " + name +
                           "'s extents and strides reach past a 64-bit element offset");
  return {};
}

/// Whether two distinct indices of `v` may address the same element. Sufficient test for
/// strided layouts: order the dimensions with extent > 1 by |stride|; each |stride| must
/// exceed the largest offset reachable by the smaller dimensions together, sum (extent - 1)
/// * |stride|. Layouts that interleave (rare for outputs) are refused even where they happen
/// not to collide. Call after check_view passed (the sums then fit in int64).
template <class T, int R>
bool may_overlap(const tensor_view<T, R>& v) {
  if (element_count(v) <= 1) return false;
  index_t ext[R], step[R];  // extents > 1 and their |stride|
  int n = 0;
  for (int d = 0; d < R; ++d)
    if (v.extents[d] > 1) {
      ext[n] = v.extents[d];
      step[n] = v.strides[d] < 0 ? -v.strides[d] : v.strides[d];
      ++n;
    }
  // Insertion sort by |stride| (R is small).
  for (int i = 1; i < n; ++i)
    for (int j = i; j > 0 && step[j] < step[j - 1]; --j) {
      std::swap(step[j], step[j - 1]);
      std::swap(ext[j], ext[j - 1]);
    }
  index_t reach = 0;  // largest offset the dimensions before i reach together
  for (int i = 0; i < n; ++i) {
    if (step[i] <= reach) return true;
    reach += (ext[i] - 1) * step[i];
  }
  return false;
}

/// Refuses an output view whose elements overlap (written twice: the result would depend on
/// the order of the writes, and threads would race).
template <class T, int R>
status check_no_overlap(const char* fn, const char* name, const tensor_view<T, R>& v) {
  if (!may_overlap(v)) return {};
  std::string shape, strides;
  for (int d = 0; d < R; ++d) {
    shape += (d ? ", " : "") + str(v.extents[d]);
    strides += (d ? ", " : "") + str(v.strides[d]);
  }
  return status::failure(std::string(fn) + ": " + name +
                         "'s elements must not overlap (each index must address its own "
                         "element), but extents (" +
                         shape + ") with strides (" + strides +
                         ") make distinct indices share elements");
}

/// One dimension of the search in views_share_bytes: `step` bytes (> 0) taken z times, z in
/// [lo, hi].
struct lattice_term {
  index_t step, lo, hi;
};

inline index_t floor_div(index_t a, index_t b) {  // b > 0
  const index_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
inline index_t ceil_div(index_t a, index_t b) { return -floor_div(-a, b); }

/// Whether some z (z_j in [t[j].lo, t[j].hi]) makes sum_{j >= k} t[j].step z_j fall in
/// [lo, hi]. Terms are sorted by step, largest first; rest[j] = {least, greatest} sum of the
/// terms from j on. Returns 1 (found), 0 (none), or -1 once `budget` nodes are spent.
inline int lattice_hits(const lattice_term* t, int n, const std::pair<index_t, index_t>* rest,
                        int k, index_t lo, index_t hi, long& budget) {
  if (--budget < 0) return -1;
  if (k == n) return lo <= 0 && 0 <= hi ? 1 : 0;
  // Only the z_k that leave a remainder the later terms can still reach: with nested strides
  // (each step above everything the smaller ones reach) there are at most two.
  const index_t z_lo = std::max(t[k].lo, ceil_div(lo - rest[k + 1].second, t[k].step));
  const index_t z_hi = std::min(t[k].hi, floor_div(hi - rest[k + 1].first, t[k].step));
  for (index_t z = z_lo; z <= z_hi; ++z)
    if (const int r =
            lattice_hits(t, n, rest, k + 1, lo - t[k].step * z, hi - t[k].step * z, budget);
        r != 0)
      return r;
  return 0;
}

/// The least and greatest element offset of a view (after check_view), or false when it is
/// empty.
template <class T, int R>
bool offset_span(const tensor_view<T, R>& v, index_t& lo, index_t& hi) {
  lo = hi = 0;
  for (int d = 0; d < R; ++d) {
    if (v.extents[d] <= 0) return false;
    const index_t reach = v.strides[d] * (v.extents[d] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  return true;
}

/// Whether some element of `a` and some element of `b` share a byte. Exact: an element of a
/// is at byte a.data + sum_d a.strides[d] * sizeof(TA) * i_d, and the two share a byte when
/// that address less b's lies in [-(sizeof(TA) - 1), sizeof(TB) - 1]; a search over the
/// indices, largest stride first, decides it. Views whose spans are disjoint (separate
/// buffers: nearly every call) are decided without the search. Views that interleave within
/// one buffer (q, k and v of a packed QKV projection, an output in another slot of it) are
/// allowed exactly when no element is shared. A search longer than 2^16 steps (strides that do
/// not nest, with overlapping spans) is not decided and reports no sharing. Call after
/// check_view passed for both.
template <class TA, int RA, class TB, int RB>
bool views_share_bytes(const tensor_view<TA, RA>& a, const tensor_view<TB, RB>& b) {
  const index_t size_a = static_cast<index_t>(sizeof(TA)),
                size_b = static_cast<index_t>(sizeof(TB));
  // Each view's element offsets span [lo, hi]; an empty view shares nothing.
  index_t lo_a = 0, hi_a = 0, lo_b = 0, hi_b = 0;
  if (!offset_span(a, lo_a, hi_a) || !offset_span(b, lo_b, hi_b)) return false;
  const index_t delta = static_cast<index_t>(reinterpret_cast<std::uintptr_t>(a.data) -
                                             reinterpret_cast<std::uintptr_t>(b.data));
  // Byte spans of real memory are far below these limits; views beyond them are not buffers
  // that could alias, and staying below keeps every sum here in int64.
  constexpr index_t limit = index_t(1) << 58;
  if (delta > limit || delta < -limit || hi_a - lo_a > limit / size_a ||
      hi_b - lo_b > limit / size_b || lo_a < -limit / size_a || lo_b < -limit / size_b)
    return false;
  // Relative to b's first element: a covers bytes [delta + lo_a size_a, delta + (hi_a + 1)
  // size_a), b covers [lo_b size_b, (hi_b + 1) size_b). Separate buffers end here.
  if (delta + lo_a * size_a >= (hi_b + 1) * size_b || lo_b * size_b >= delta + (hi_a + 1) * size_a)
    return false;

  lattice_term t[RA + RB];
  int n = 0;
  // sign * stride * size * i with i in [0, extent - 1], written with a positive step. The
  // stride of an extent-1 dimension is never used (and may be anything): skipped before any
  // arithmetic on it.
  auto add = [&](index_t stride, index_t size, index_t extent, bool negate) {
    if (extent <= 1 || stride == 0) return;
    const index_t coeff = (negate ? -stride : stride) * size;
    const lattice_term term =
        coeff > 0 ? lattice_term{coeff, 0, extent - 1} : lattice_term{-coeff, -(extent - 1), 0};
    for (int j = 0; j < n; ++j)
      if (t[j].step == term.step) {  // equal steps add their ranges (exactly)
        t[j].lo += term.lo;
        t[j].hi += term.hi;
        return;
      }
    t[n++] = term;
  };
  for (int d = 0; d < RA; ++d) add(a.strides[d], size_a, a.extents[d], false);
  for (int d = 0; d < RB; ++d) add(b.strides[d], size_b, b.extents[d], true);
  for (int i = 1; i < n; ++i)  // insertion sort by step, largest first (n <= RA + RB)
    for (int j = i; j > 0 && t[j].step > t[j - 1].step; --j) std::swap(t[j], t[j - 1]);
  std::pair<index_t, index_t> rest[RA + RB + 1];
  rest[n] = {0, 0};
  for (int j = n - 1; j >= 0; --j)
    rest[j] = {rest[j + 1].first + t[j].step * t[j].lo, rest[j + 1].second + t[j].step * t[j].hi};
  // sum_j step_j z_j + delta must lie in [-(size_a - 1), size_b - 1].
  const index_t lo = -(size_a - 1) - delta, hi = (size_b - 1) - delta;
  if (hi < rest[0].first || lo > rest[0].second) return false;  // the spans are disjoint
  long budget = 1L << 16;
  return lattice_hits(t, n, rest, 0, lo, hi, budget) == 1;
}

/// The error of an output `written` that shares memory with another argument `other`.
inline status shared_memory_failure(const char* fn, const char* written, const char* other) {
  return status::failure(std::string(fn) + ": " + written + " and " + other + " share memory; " +
                         written +
                         " is written by this call, so it must not alias any other argument "
                         "(give it a buffer of its own)");
}

/// Refuses an output `written` that shares memory with another argument `other` (an input it
/// would overwrite while it is still read, or a second output), naming both.
template <class TA, int RA, class TB, int RB>
status check_disjoint(const char* fn, const char* written, const tensor_view<TA, RA>& w,
                      const char* other, const tensor_view<TB, RB>& o) {
  return views_share_bytes(w, o) ? shared_memory_failure(fn, written, other) : status{};
}

/// A view's bytes [lo, hi) as addresses; lo == hi for an empty view, or one whose span is
/// beyond any buffer (views_share_bytes reports no sharing for those either).
struct byte_range {
  std::uintptr_t lo = 0, hi = 0;
};
template <class T, int R>
byte_range bytes_of(const tensor_view<T, R>& v) {
  constexpr index_t limit = index_t(1) << 58;
  const index_t size = static_cast<index_t>(sizeof(T));
  index_t lo = 0, hi = 0;
  if (!offset_span(v, lo, hi) || hi - lo > limit / size || lo < -limit / size || hi > limit / size)
    return {};
  // Unsigned wrap-around adds a negative offset exactly.
  const auto base = reinterpret_cast<std::uintptr_t>(v.data);
  return {base + static_cast<std::uintptr_t>(lo * size),
          base + static_cast<std::uintptr_t>((hi + 1) * size)};
}

/// The name of the first (name, view) pair whose view shares memory with `w` (whose bytes
/// are `wr`), or null. Views in other buffers are passed over by their byte ranges alone.
template <class TW, int RW>
const char* first_sharing(const tensor_view<TW, RW>&, byte_range) {
  return nullptr;
}
template <class TW, int RW, class T, int R, class... Rest>
const char* first_sharing(const tensor_view<TW, RW>& w, byte_range wr, const char* name,
                          const tensor_view<T, R>& v, const Rest&... rest) {
  const byte_range vr = bytes_of(v);
  const bool may_share = wr.lo < wr.hi && vr.lo < vr.hi && wr.lo < vr.hi && vr.lo < wr.hi;
  return may_share && views_share_bytes(w, v) ? name : first_sharing(w, wr, rest...);
}

/// check_disjoint of one written view against each (name, view) pair that follows.
template <class TW, int RW, class... Pairs>
status check_disjoint_from(const char* fn, const char* written, const tensor_view<TW, RW>& w,
                           const Pairs&... pairs) {
  const char* other = first_sharing(w, bytes_of(w), pairs...);
  return other ? shared_memory_failure(fn, written, other) : status{};
}

/// Whether two views address the same elements in the same order (an in-place operation's
/// output given as its input): same first element, extents and strides (the stride of an
/// extent-1 dimension is never used).
template <class TA, class TB, int R>
bool same_elements(const tensor_view<TA, R>& a, const tensor_view<TB, R>& b) {
  if (sizeof(TA) != sizeof(TB) ||
      static_cast<const void*>(a.data) != static_cast<const void*>(b.data))
    return false;
  for (int d = 0; d < R; ++d)
    if (a.extents[d] != b.extents[d] || (a.extents[d] > 1 && a.strides[d] != b.strides[d]))
      return false;
  return true;
}

}  // namespace detail
}  // namespace alibi
