// SPDX-License-Identifier: MIT
// Helpers of the tests that store K/V in other types or layouts than the grid's fp32 rows
// (test_half_kv.cpp, test_key_blocks.cpp).
#pragma once

#include <cstring>
#include <vector>

#include "common.hpp"

namespace alibi_test {

/// Rounds every element of t (view, padding and guards alike) to T and back: NaN padding
/// stays NaN, the values become exactly representable in T.
template <class T>
void round_to(padded_tensor<float>& t) {
  for (float& x : t.buf) x = static_cast<float>(static_cast<T>(x));
}

/// A T copy of t with the same geometry: the same padding and guards (NaN stays NaN).
template <class T>
padded_tensor<T> converted(const padded_tensor<float>& t, const case_spec& s) {
  padded_tensor<T> r(t.view.extents[0], t.view.extents[1], t.view.extents[2], t.view.extents[3],
                     s.bshd, static_cast<T>(t.fill), 3, s.aligned ? 8 : 5);
  for (std::size_t e = 0; e < t.buf.size(); ++e) r.buf[e] = static_cast<T>(t.buf[e]);
  return r;
}

/// A call's out (batch, hq, lq, dv) and logsumexp (batch, hq, lq), dense.
struct out_lse {
  std::vector<float> out, lse;
};

/// The eigen backend on c's q and the given K (rows, or in blocks) and V, with logsumexp and
/// far-tile skipping as asked; out and lse dense.
template <class TK, int RK, class TV>
out_lse run_eigen(const case_data& c, const alibi::tensor_view<TK, RK>& k,
                  const alibi::tensor_view<TV, 4>& v, int threads, bool skip = true) {
  const case_spec& s = c.spec;
  out_lse r;
  r.out.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq * s.v_dim()), 0.0f);
  r.lse.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq), 0.0f);
  alibi::attention_params p = c.params;
  p.skip_far_tiles = skip;
  p.logsumexp = alibi::make_view(r.lse.data(), s.batch, s.hq, s.lq);
  alibi::attention(alibi::backend::eigen{threads}, c.q.view, k, v,
                   alibi::make_view(r.out.data(), s.batch, s.hq, s.lq, s.v_dim()), p);
  return r;
}

/// Bitwise equality, NaN included.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The grid case with K/V rounded to T, so that K/V stored as T hold the same numbers as the
/// oracle reads: check_call with `run` (which stores them as it likes) under the fp32
/// tolerance rule, the storage being exact and the arithmetic fp32.
template <class T, class Run>
comparison check_stored(const case_spec& spec, Run&& run) {
  case_data c(spec);
  round_to<T>(c.k);
  round_to<T>(c.v);
  return check_call(c, run);
}

/// c with its K/V copied to every query head (groups of one): the same problem without GQA.
inline case_data per_head_copy(const case_data& c) {
  case_spec mha = c.spec;
  mha.hkv = c.spec.hq;
  case_data d(mha);
  const index_t g = c.spec.hq / c.spec.hkv;
  for (index_t b = 0; b < mha.batch; ++b)
    for (index_t h = 0; h < mha.hq; ++h)
      for (index_t j = 0; j < mha.lk; ++j) {
        for (index_t e = 0; e < mha.d; ++e) d.k.view(b, h, j, e) = c.k.view(b, h / g, j, e);
        for (index_t e = 0; e < mha.v_dim(); ++e) d.v.view(b, h, j, e) = c.v.view(b, h / g, j, e);
      }
  return d;
}

}  // namespace alibi_test
