// SPDX-License-Identifier: MIT
// alibi::backend::reference for ragged calls: each sequence's tokens are gathered from the
// pages (dequantized exactly, in double) and the reference's own attention runs on that
// sequence as a rectangular problem. The oracle of the ragged tests.
#pragma once

#include <cstdint>
#include <vector>

#include "alibi/backend/reference/attention.hpp"
#include "alibi/ragged_attention.hpp"

namespace alibi {
namespace detail {

/// A stored K/V element as a double, with its int8 scale applied (q * scale is exact in
/// double: a 7-bit integer times a 24-bit significand).
template <class T>
double stored_as_double(const T& x, float scale) {
  if constexpr (is_int8_kv<T>)
    return static_cast<double>(x) * static_cast<double>(scale);
  else
    return input_as_double(x);
}

/// Sequence s of a ragged call as the rectangular problem of one batch entry: its rows, its
/// keys, its slopes, its logsumexp rows. Shared by the backends that run a sequence alone.
inline attention_problem sequence_problem(const ragged_problem& rp, index_t s) {
  attention_problem p = rp.p;
  p.batch = 1;
  p.q_len = rp.q_lens[static_cast<std::size_t>(s)];
  p.k_len = rp.k_lens[static_cast<std::size_t>(s)];
  p.q_lengths = {};
  p.k_lengths = {};
  if (p.slopes.values.data && p.slopes.values.extents[0] != 1) {
    p.slopes.values.data = p.slopes.values.ptr(s);
    p.slopes.values.extents[0] = 1;
  }
  p.lse = rp.lse;
  if (rp.lse.data) {
    p.lse.data = rp.lse.ptr(0, 0, rp.row0(s));
    p.lse.extents[0] = 1;
    p.lse.extents[2] = p.q_len;
  }
  p.key_norm_bounds = {};
  p.stats = nullptr;
  return p;
}

template <>
struct ragged_impl<backend::reference> {
  template <class TQ, class T, class TO>
  static constexpr bool implemented = (is_reference_input<TQ> &&
                                       (is_reference_input<T> ||
                                        is_int8_kv<T>)&&std::is_floating_point<TO>::value);

  template <class TQ, class T, class TO>
  static status can_implement(const backend::reference&, const ragged_problem&) {
    if (!implemented<TQ, T, TO>)
      return status::failure(
          "alibi::ragged_attention (reference): q float, double, Eigen::half or Eigen::bfloat16, "
          "K/V those or std::int8_t, out float or double");
    return {};
  }

  template <class TQ, class KV, class TO>
  static void run(const backend::reference&, const ragged_problem& rp, tensor_view<const TQ, 3> q,
                  const KV& kv, tensor_view<TO, 3> out) {
    using T = typename kv_element<KV>::type;
    const kv_rows<KV> rows{kv};
    const attention_problem& P = rp.p;
    for (index_t s = 0; s < rp.num_seqs(); ++s) {
      const attention_problem p = sequence_problem(rp, s);
      const index_t n = p.k_len, r0 = rp.row0(s);
      std::vector<double> kd(static_cast<std::size_t>(P.kv_heads * n * P.head_dim));
      std::vector<double> vd(static_cast<std::size_t>(P.kv_heads * n * P.v_head_dim));
      const auto k = make_view(kd.data(), index_t(1), P.kv_heads, n, P.head_dim);
      const auto v = make_view(vd.data(), index_t(1), P.kv_heads, n, P.v_head_dim);
      for (index_t g = 0; g < P.kv_heads; ++g)
        for (index_t j = 0; j < n; ++j) {
          const float ks = is_int8_kv<T> ? rows.k_scale(s, g, j) : 1.0f;
          const float vs = is_int8_kv<T> ? rows.v_scale(s, g, j) : 1.0f;
          const T* kr = rows.k(s, g, j);
          const T* vr = rows.v(s, g, j);
          for (index_t e = 0; e < P.head_dim; ++e) k(0, g, j, e) = stored_as_double(kr[e], ks);
          for (index_t e = 0; e < P.v_head_dim; ++e) v(0, g, j, e) = stored_as_double(vr[e], vs);
        }
      // Sequence s's rows of the packed q and out as (1, q_heads, q_len, dim) views.
      const auto qs = make_strided_view<const TQ, 4>(q.ptr(r0), {1, P.q_heads, p.q_len, P.head_dim},
                                                     {0, q.strides[1], q.strides[0], 1});
      const auto os = make_strided_view<TO, 4>(out.ptr(r0), {1, P.q_heads, p.q_len, P.v_head_dim},
                                               {0, out.strides[1], out.strides[0], 1});
      attention_impl<backend::reference>::compute(p, qs, tensor_view<const double, 4>(k),
                                                  tensor_view<const double, 4>(v), os);
    }
  }
};

}  // namespace detail
}  // namespace alibi
