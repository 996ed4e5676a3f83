// SPDX-License-Identifier: MIT
// The merge of partial attention results: (out_a, lse_a) + (out_b, lse_b) -> (out, lse),
// where a and b are the attention of the same queries over two disjoint sets of keys (two
// key chunks, two ranks of a ring, two caches). Split-KV, sequence-parallel attention and
// users share it; every backend implements it (attention_impl<Backend>::merge) with the same
// online-softmax state (detail/online_softmax.hpp).
#pragma once

#include <string>
#include <type_traits>

#include "alibi/attention.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {

/// The checked arguments of a merge: outputs (batch, heads, len, dim), logsumexps
/// (batch, heads, len); lse may be omitted (null data).
template <class T>
struct partial_merge_args {
  tensor_view<const T, 4> out_a, out_b;
  tensor_view<const float, 3> lse_a, lse_b;
  tensor_view<T, 4> out;
  tensor_view<float, 3> lse;
};

/// The merge of one row element by element, for any backend that computes in float:
/// o(d) = (wa * a(d) + wb * b(d)) * inv for every element, and the merged logsumexp `lse`.
struct row_merge {
  float wa = 0.0f, wb = 0.0f, inv = 0.0f, lse = 0.0f;

  ALIBI_HOST_DEVICE static row_merge make(float lse_a, float lse_b) {
    // The states are built from the logsumexps less the larger one: lse x log2(e) overflows
    // fp32 beyond 2.4e38 in magnitude, and a difference that overflows is -inf, weight 0.
    const float m = max_keep_nan(lse_a, lse_b);
    const float ref = m > neg_inf_f() && m < -neg_inf_f() ? m : 0.0f;
    const softmax_merge mg =
        merge_states(softmax_state::from_lse(lse_a - ref), softmax_state::from_lse(lse_b - ref));
    row_merge r;
    r.wa = mg.wa;
    r.wb = mg.wb;
    r.inv = mg.state.inverse_sum();
    r.lse = mg.state.lse(ref);
    return r;
  }
  /// A side whose weight is 0 (no keys) is never read: its output may be anything.
  ALIBI_HOST_DEVICE float value(float a, float b) const {
    return ((wa != 0.0f ? wa * a : 0.0f) + (wb != 0.0f ? wb * b : 0.0f)) * inv;
  }
};

/// The host merge of every row of head bh (= b * heads + h): what the host backends run,
/// one call per head.
template <class T>
void merge_head_rows(const partial_merge_args<T>& a, index_t bh) {
  const index_t H = a.out.extents[1], L = a.out.extents[2], D = a.out.extents[3];
  const index_t b = bh / H, h = bh % H;
  for (index_t i = 0; i < L; ++i) {
    const row_merge r = row_merge::make(a.lse_a(b, h, i), a.lse_b(b, h, i));
    for (index_t d = 0; d < D; ++d)
      a.out(b, h, i, d) = static_cast<T>(r.value(static_cast<float>(a.out_a(b, h, i, d)),
                                                 static_cast<float>(a.out_b(b, h, i, d))));
    if (a.lse.data) a.lse(b, h, i) = r.lse;
  }
}

template <class TA, class TB, class TO>
status check_merge(const tensor_view<TA, 4>& out_a, const tensor_view<const float, 3>& lse_a,
                   const tensor_view<TB, 4>& out_b, const tensor_view<const float, 3>& lse_b,
                   const tensor_view<TO, 4>& out, const tensor_view<float, 3>& lse) {
  const char* fn = "alibi::merge_partials";
  for (const status& s :
       {check_view(fn, "out_a", out_a), check_view(fn, "out_b", out_b), check_view(fn, "out", out),
        check_view(fn, "lse_a", lse_a), check_view(fn, "lse_b", lse_b)})
    if (!s) return s;
  const index_t rows[] = {out.extents[0], out.extents[1], out.extents[2]};
  for (int d = 0; d < 4; ++d)
    if (out_a.extents[d] != out.extents[d] || out_b.extents[d] != out.extents[d])
      return status::failure(std::string(fn) +
                             ": out_a, out_b and out must have the same shape "
                             "(batch, heads, len, dim); extent(" +
                             str(d) + ") is " + str(out_a.extents[d]) + ", " +
                             str(out_b.extents[d]) + " and " + str(out.extents[d]));
  for (int d = 0; d < 3; ++d)
    if (lse_a.extents[d] != rows[d] || lse_b.extents[d] != rows[d])
      return status::failure(std::string(fn) +
                             ": lse_a and lse_b must have shape (batch, heads, len) of out; "
                             "extent(" +
                             str(d) + ") is " + str(lse_a.extents[d]) + " and " +
                             str(lse_b.extents[d]) + ", expected " + str(rows[d]));
  if (status s = check_optional(fn, "lse", lse, rows, "(batch, heads, len)"); !s) return s;
  // The rows are merged in parallel: an output element written from two rows would race.
  if (status s = check_no_overlap(fn, "out", out); !s) return s;
  if (status s = check_no_overlap(fn, "lse", lse); !s) return s;
  // In place is allowed (out the very view out_a or out_b, lse lse_a or lse_b: each element is
  // read before it is written); any other sharing with an argument is refused.
  for (const status& s :
       {same_elements(out, out_a) ? status{} : check_disjoint(fn, "out", out, "out_a", out_a),
        same_elements(out, out_b) ? status{} : check_disjoint(fn, "out", out, "out_b", out_b),
        same_elements(lse, lse_a) ? status{} : check_disjoint(fn, "lse", lse, "lse_a", lse_a),
        same_elements(lse, lse_b) ? status{} : check_disjoint(fn, "lse", lse, "lse_b", lse_b),
        check_disjoint_from(fn, "out", out, "lse_a", lse_a, "lse_b", lse_b, "lse", lse),
        check_disjoint_from(fn, "lse", lse, "out_a", out_a, "out_b", out_b)})
    if (!s) return s;
  return {};
}

}  // namespace detail

/// Merges two partial attention results over disjoint key sets into the result over their
/// union: out = (exp(lse_a) out_a + exp(lse_b) out_b) / (exp(lse_a) + exp(lse_b)) and
/// lse = log(exp(lse_a) + exp(lse_b)), computed without overflow (relative to the larger
/// logsumexp), row by row. Natural-log logsumexps, as attention() writes them. A side with
/// lse -inf (no keys) contributes nothing and its output is not read; both -inf gives 0 and
/// -inf; NaN on either side gives NaN. `out` may be the same view as out_a or out_b (and
/// `lse` as lse_a or lse_b): each element is read before it is written. `lse` may be
/// omitted (default-constructed). Shapes: out_a, out_b, out (batch, heads, len, dim),
/// lse_a, lse_b, lse (batch, heads, len), any strides, in the backend's memory.
template <class Backend, class TA, class TB, class TO>
void merge_partials(const Backend& backend, tensor_view<TA, 4> out_a,
                    tensor_view<const float, 3> lse_a, tensor_view<TB, 4> out_b,
                    tensor_view<const float, 3> lse_b, tensor_view<TO, 4> out,
                    tensor_view<float, 3> lse = {}) {
  using T = std::remove_const_t<TA>;
  static_assert(std::is_same<T, std::remove_const_t<TB>>::value && std::is_same<T, TO>::value,
                "alibi::merge_partials: out_a, out_b and out must have the same element type");
  detail::check_merge(out_a, lse_a, out_b, lse_b, out, lse).throw_if_failed();
  detail::partial_merge_args<T> args{out_a, out_b, lse_a, lse_b, out, lse};
  detail::attention_impl<Backend>::merge(backend, args);
}

}  // namespace alibi
