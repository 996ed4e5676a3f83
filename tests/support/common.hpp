// SPDX-License-Identifier: MIT
// Shared test machinery: tensors with NaN-filled padding and guard elements, the case
// list every backend runs, the double-precision oracle, the fp32 naive computation that
// sets the tolerance, and the comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <alibi/attention.hpp>
#include <alibi/backend/reference/attention.hpp>

namespace alibi_test {

using alibi::index_t;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

/// A (batch, heads, seq, dim) tensor in either memory layout, with `pad_seq` extra rows per
/// sequence and `pad_dim` extra floats per row that the view does not cover, and `guard`
/// elements after the end. Everything outside the view holds `fill`.
template <class T>
struct padded_tensor {
  std::vector<T> buf;
  alibi::tensor_view<T, 4> view;
  static constexpr index_t guard = 37;
  T fill;

  padded_tensor(index_t b, index_t h, index_t s, index_t d, bool bshd, T fill_value,
                index_t pad_seq = 3, index_t pad_dim = 5)
      : fill(fill_value) {
    const index_t sc = s + pad_seq, dc = d + pad_dim;
    buf.assign(static_cast<std::size_t>(b * h * sc * dc + guard), fill);
    if (bshd)  // memory (batch, seq, heads, dim)
      view = alibi::make_strided_view<T, 4>(buf.data(), {b, h, s, d}, {sc * h * dc, dc, h * dc, 1});
    else  // memory (batch, heads, seq, dim)
      view =
          alibi::make_strided_view<T, 4>(buf.data(), {b, h, s, d}, {h * sc * dc, sc * dc, dc, 1});
  }
  template <class F>
  void for_each(F&& f) {
    for (index_t b = 0; b < view.extents[0]; ++b)
      for (index_t h = 0; h < view.extents[1]; ++h)
        for (index_t i = 0; i < view.extents[2]; ++i)
          for (index_t d = 0; d < view.extents[3]; ++d) f(view(b, h, i, d), b, h, i, d);
  }
  /// Elements outside the view that no longer hold `fill` (out-of-bounds writes).
  index_t touched_outside() const {
    std::vector<char> inside(buf.size(), 0);
    for (index_t b = 0; b < view.extents[0]; ++b)
      for (index_t h = 0; h < view.extents[1]; ++h)
        for (index_t i = 0; i < view.extents[2]; ++i)
          for (index_t d = 0; d < view.extents[3]; ++d)
            inside[static_cast<std::size_t>(&view(b, h, i, d) - buf.data())] = 1;
    index_t n = 0;
    for (std::size_t e = 0; e < buf.size(); ++e)
      if (!inside[e] && !(buf[e] == fill || (buf[e] != buf[e] && fill != fill))) ++n;
    return n;
  }
};

/// One attention configuration.
struct case_spec {
  index_t batch = 1, hq = 1, hkv = 1, lq = 1, lk = 1, d = 64, dv = -1;
  bool causal = false;
  index_t window_left = -1, window_right = -1;
  bool bshd = false;      // (batch, seq, heads, dim) memory
  bool aligned = false;   // rows padded to 16-byte multiples (else odd padding)
  bool lengths = false;   // per-batch q/k lengths, one of them 0
  bool key_mask = false;  // boolean key mask with holes and one fully masked entry
  bool offsets = false;   // explicit positions (large absolute positions)
  bool caller_slopes = false;
  bool no_alibi = false;
  float slope_scale = 1.0f;  // multiplies the generated slopes
  float value_scale = 1.0f;  // inputs are randn * value_scale
  std::optional<float> scale{};
  std::uint64_t seed = 1;

  index_t v_dim() const { return dv < 0 ? d : dv; }
  std::string name() const {
    std::ostringstream o;
    o << "B" << batch << " H" << hq << "/" << hkv << " Lq" << lq << " Lk" << lk << " D" << d;
    if (dv >= 0) o << " Dv" << dv;
    if (causal) o << " causal";
    if (window_left >= 0 || window_right >= 0)
      o << " window(" << window_left << "," << window_right << ")";
    if (bshd) o << " bshd";
    if (lengths) o << " lengths";
    if (key_mask) o << " keymask";
    if (offsets) o << " offsets";
    if (caller_slopes) o << " caller-slopes";
    if (no_alibi) o << " no-alibi";
    if (slope_scale != 1.0f) o << " slope*" << slope_scale;
    if (value_scale != 1.0f) o << " x" << value_scale;
    if (scale) o << " scale=" << *scale;
    return o.str();
  }
};

/// The inputs of one case, with NaN in every byte the attention must not read.
struct case_data {
  case_spec spec;
  padded_tensor<float> q, k, v;
  std::vector<index_t> q_lengths, k_lengths, q_offsets, k_offsets;
  std::vector<char> key_mask;  // (batch, lk) as bytes; viewed as bool
  std::vector<float> slopes;   // (batch, hq)
  alibi::attention_params params;

  explicit case_data(const case_spec& c)
      : spec(c),
        q(c.batch, c.hq, c.lq, c.d, c.bshd, nan_f, 3, c.aligned ? 8 : 5),
        k(c.batch, c.hkv, c.lk, c.d, c.bshd, nan_f, 3, c.aligned ? 8 : 5),
        v(c.batch, c.hkv, c.lk, c.v_dim(), c.bshd, nan_f, 3, c.aligned ? 8 : 5) {
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<float> randn(0.0f, 1.0f);
    auto init = [&](float& x, index_t, index_t, index_t, index_t) {
      x = randn(rng) * c.value_scale;
    };
    q.for_each(init);
    k.for_each(init);
    v.for_each(init);
    params.scale = c.scale;
    params.mask.causal = c.causal;
    params.mask.window_left = c.window_left;
    params.mask.window_right = c.window_right;
    if (c.no_alibi) params.slopes = alibi::slope_config::none();
    params.slopes.scale = c.slope_scale;
    if (c.lengths) {
      for (index_t b = 0; b < c.batch; ++b) {
        // Entry 1 has no keys, entry 2 no queries; the rest vary.
        q_lengths.push_back(b == 2 ? 0 : std::max<index_t>(c.lq - b * 3, c.lq > 0 ? 1 : 0));
        k_lengths.push_back(b == 1 ? 0 : std::max<index_t>(c.lk - b * 5, c.lk > 0 ? 1 : 0));
      }
      params.q_lengths = alibi::make_view<const index_t>(q_lengths.data(), c.batch);
      params.k_lengths = alibi::make_view<const index_t>(k_lengths.data(), c.batch);
      // Padding beyond each length holds NaN, as a real padded batch may.
      for (index_t b = 0; b < c.batch; ++b) {
        for (index_t h = 0; h < c.hq; ++h)
          for (index_t i = q_lengths[b]; i < c.lq; ++i)
            for (index_t d = 0; d < c.d; ++d) q.view(b, h, i, d) = nan_f;
        for (index_t h = 0; h < c.hkv; ++h)
          for (index_t j = k_lengths[b]; j < c.lk; ++j) {
            for (index_t d = 0; d < c.d; ++d) k.view(b, h, j, d) = nan_f;
            for (index_t d = 0; d < c.v_dim(); ++d) v.view(b, h, j, d) = nan_f;
          }
      }
    }
    if (c.key_mask) {
      key_mask.assign(static_cast<std::size_t>(c.batch * c.lk), 0);
      std::bernoulli_distribution hole(0.15);
      for (index_t b = 0; b < c.batch; ++b)
        for (index_t j = 0; j < c.lk; ++j) {
          const bool excluded = (b == c.batch - 1 && c.batch > 1) || hole(rng);
          key_mask[static_cast<std::size_t>(b * c.lk + j)] = excluded;
          if (excluded)  // excluded keys are unused memory: NaN there must not matter
            for (index_t h = 0; h < c.hkv; ++h) {
              for (index_t d = 0; d < c.d; ++d) k.view(b, h, j, d) = nan_f;
              for (index_t d = 0; d < c.v_dim(); ++d) v.view(b, h, j, d) = nan_f;
            }
        }
      params.key_mask = alibi::make_view<const bool>(reinterpret_cast<const bool*>(key_mask.data()),
                                                     c.batch, c.lk);
    }
    if (c.offsets) {
      // Large absolute positions (a long-running KV cache), small relative distances.
      const index_t base = index_t(1) << 40;
      for (index_t b = 0; b < c.batch; ++b) {
        k_offsets.push_back(base + 1000 * b);
        q_offsets.push_back(base + 1000 * b + c.lk - c.lq + (b % 2 == 1 ? 7 : 0));
      }
      params.q_offsets = alibi::make_view<const index_t>(q_offsets.data(), c.batch);
      params.k_offsets = alibi::make_view<const index_t>(k_offsets.data(), c.batch);
    }
    if (c.caller_slopes) {
      std::uniform_real_distribution<float> u(0.0f, 0.6f);
      for (index_t i = 0; i < c.batch * c.hq; ++i) slopes.push_back(i == 0 ? 0.0f : u(rng));
      params.slopes = alibi::slope_config::per_batch_head(slopes.data(), c.batch, c.hq);
    }
  }
};

/// out (double) and logsumexp from the double-precision oracle.
struct oracle_result {
  std::vector<double> out;  // (batch, hq, lq, dv) dense
  std::vector<float> lse;   // (batch, hq, lq)
};

inline oracle_result run_oracle(case_data& c) {
  const case_spec& s = c.spec;
  oracle_result r;
  r.out.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq * s.v_dim()), 0.0);
  r.lse.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq), 0.0f);
  alibi::attention_params p = c.params;
  p.logsumexp = alibi::make_view(r.lse.data(), s.batch, s.hq, s.lq);
  alibi::attention(alibi::backend::reference{}, c.q.view, c.k.view, c.v.view,
                   alibi::make_view(r.out.data(), s.batch, s.hq, s.lq, s.v_dim()), p);
  return r;
}

/// The seeds' algorithm in fp32 (float dot products, float softmax): the precision a
/// straightforward fp32 implementation achieves, which sets the tolerance. `round` is
/// applied to the probabilities before P V and to the outputs: the identity for fp32, a
/// rounding to half or bfloat16 for the naive computation in those precisions.
struct naive_result {
  std::vector<float> out;  // (batch, hq, lq, dv) dense
  std::vector<float> lse;  // (batch, hq, lq)
  double score_scale = 0;  // max over rows of |row maximum score| (fp32 contract scores)
  double value_scale = 0;  // max |v| over the keys some row uses
};

/// The fp32 contract score of query row i (head h) against key j, as a naive fp32
/// implementation computes it: a float dot product, then scale and the float bias.
inline float naive_score(const alibi::detail::attention_problem& p, const case_data& c, index_t b,
                         index_t h, index_t i, index_t j) {
  float dot = 0;
  for (index_t d = 0; d < c.spec.d; ++d)
    dot += c.q.view(b, h, i, d) * c.k.view(b, p.kv_head(h), j, d);
  return p.scale * dot +
         (p.slopes.enabled ? alibi::alibi_bias(p.slope(b, h), p.q_offset(b) + i, p.k_offset(b) + j)
                           : 0.0f);
}

template <class Round>
naive_result run_naive(case_data& c, Round round) {
  const case_spec& s = c.spec;
  alibi::detail::attention_problem p;
  naive_result r;
  r.out.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq * s.v_dim()), 0.0f);
  r.lse.assign(static_cast<std::size_t>(s.batch * s.hq * s.lq),
               -std::numeric_limits<float>::infinity());
  auto ov = alibi::make_view(r.out.data(), s.batch, s.hq, s.lq, s.v_dim());
  alibi::detail::make_problem(c.q.view, c.k.view, c.v.view, ov, c.params, true, p)
      .throw_if_failed();
  std::vector<float> row(static_cast<std::size_t>(s.lk));
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.hq; ++h) {
      const index_t hk = p.kv_head(h);
      for (index_t i = 0; i < p.len_q(b); ++i) {
        const alibi::index_range kr = p.key_range(b, i);
        float m = -std::numeric_limits<float>::infinity();
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (p.key_excluded(b, j)) continue;
          row[j] = naive_score(p, c, b, h, i, j);
          m = std::max(m, row[j]);
          for (index_t d = 0; d < s.v_dim(); ++d)
            r.value_scale =
                std::max(r.value_scale, std::abs(static_cast<double>(c.v.view(b, hk, j, d))));
        }
        if (m == -std::numeric_limits<float>::infinity()) continue;
        r.score_scale = std::max(r.score_scale, std::abs(static_cast<double>(m)));
        float sum = 0;
        for (index_t j = kr.begin; j < kr.end; ++j)
          if (!p.key_excluded(b, j)) sum += (row[j] = std::exp(row[j] - m));
        r.lse[static_cast<std::size_t>((b * s.hq + h) * s.lq + i)] = m + std::log(sum);
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (p.key_excluded(b, j)) continue;
          const float w = round(row[j] / sum);
          for (index_t d = 0; d < s.v_dim(); ++d) ov(b, h, i, d) += w * c.v.view(b, hk, j, d);
        }
        for (index_t d = 0; d < s.v_dim(); ++d) ov(b, h, i, d) = round(ov(b, h, i, d));
      }
    }
  return r;
}

inline naive_result run_naive_fp32(case_data& c) {
  return run_naive(c, [](float x) { return x; });
}

/// The outcome of comparing an implementation to the oracle.
struct comparison {
  double max_err = 0, naive_err = 0, tolerance = 0, lse_err = 0;
  index_t nans = 0, lse_mismatch = 0, guard_writes = 0;
  float lse_bad_got = 0, lse_bad_want = 0;  // the first logsumexp mismatch
  bool ok() const {
    return nans == 0 && max_err <= tolerance && lse_mismatch == 0 && guard_writes == 0;
  }
  std::string describe() const {
    std::ostringstream o;
    o << "max_err " << max_err << " (tolerance " << tolerance << ", naive fp32 " << naive_err
      << "), lse_err " << lse_err << ", NaNs " << nans << ", lse mismatches " << lse_mismatch
      << ", guard writes " << guard_writes;
    if (lse_mismatch)
      o << " (first: logsumexp " << lse_bad_got << ", oracle " << lse_bad_want << ")";
    return o.str();
  }
};

/// One run of a far-tile skipping test (every backend's): the comparison with the oracle,
/// the tiles computed and skipped, and (where a test compares runs) the output's values in
/// (b, h, i, e) order.
struct skip_run {
  comparison cmp;
  alibi::attention_stats stats;
  std::vector<float> out;
};

/// The tolerance rule of the design notes: max |impl - ref64| <= 2 * max |naive32 - ref64| +
/// a floor; logsumexp likewise, and exactly -inf where the oracle's is.
///
/// The floor has two parts. 8 ulps of the output scale, as the design notes ask. And the
/// rounding every fp32 implementation of the contract makes in its scores: a score near a
/// row's maximum M is an fp32 number, off by up to ulp(|M|) (about 2^-23 |M|), which moves
/// the output by up to that times max|v| and the logsumexp by that. Why it is needed: with
/// inputs x3/x5 (scores in the hundreds) or large slopes, that rounding dominates, and the
/// naive computation's error, a sample of a few rows, can be lucky; the fuzzer found cases
/// with a handful of keys where a correct kernel's error was 3-8x the naive one's, all below
/// 2^-23 |M| max|v|. For unit-scale inputs the tests keep the 1e-5 absolute bound too.
///
/// `element_eps`: the machine epsilon of a half/bfloat16 computation (0 for fp32). It adds
/// eps/2 (max|v| + max|out|): rounding the probabilities to that type moves the output by
/// at most eps/2 max|v|, and rounding the output itself by eps/2 |out|; a naive computation
/// can be lucky with either.
inline comparison compare(const case_data& c, const oracle_result& ref, const naive_result& naive,
                          const padded_tensor<float>& out, const std::vector<float>& lse,
                          double element_eps = 0.0) {
  const case_spec& s = c.spec;
  constexpr double eps = std::numeric_limits<float>::epsilon();
  comparison r;
  double scale_out = 0, naive_lse_err = 0;
  for (double x : ref.out) scale_out = std::max(scale_out, std::abs(x));
  for (std::size_t e = 0; e < ref.out.size(); ++e)
    r.naive_err = std::max(r.naive_err, std::abs(static_cast<double>(naive.out[e]) - ref.out[e]));
  for (std::size_t e = 0; e < ref.lse.size(); ++e)
    if (std::isfinite(ref.lse[e]) && std::isfinite(naive.lse[e]))
      naive_lse_err =
          std::max(naive_lse_err, std::abs(static_cast<double>(naive.lse[e]) - ref.lse[e]));
  const double score_rounding = 4 * eps * (naive.score_scale + 16);
  r.tolerance = 2 * r.naive_err + 8 * eps * std::max(1.0, scale_out) +
                score_rounding * naive.value_scale +
                element_eps / 2 * (naive.value_scale + scale_out);
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.hq; ++h)
      for (index_t i = 0; i < s.lq; ++i) {
        for (index_t d = 0; d < s.v_dim(); ++d) {
          const std::size_t e =
              static_cast<std::size_t>(((b * s.hq + h) * s.lq + i) * s.v_dim() + d);
          const float x = out.view(b, h, i, d);
          if (std::isnan(x)) ++r.nans;
          r.max_err = std::max(r.max_err, std::abs(static_cast<double>(x) - ref.out[e]));
        }
        const std::size_t li = static_cast<std::size_t>((b * s.hq + h) * s.lq + i);
        const float a = lse[li], e = ref.lse[li];
        bool bad = false;
        if (std::isinf(e) || std::isinf(a)) {
          bad = a != e;
        } else {
          const double err = std::abs(static_cast<double>(a) - e);
          r.lse_err = std::max(r.lse_err, err);
          bad = !(err <= 2 * naive_lse_err +
                             8 * eps * std::max(1.0, std::abs(static_cast<double>(e))) +
                             score_rounding);
        }
        if (bad && r.lse_mismatch++ == 0) {
          r.lse_bad_got = a;
          r.lse_bad_want = e;
        }
      }
  r.guard_writes = out.touched_outside();
  return r;
}

/// run(c, params, out): an attention call on the case's values with `params` (c's, and a
/// logsumexp view) into `out`; its output and logsumexp compared with the oracle. out is
/// padded with guards, the logsumexp has one guard after it.
template <class Run>
comparison check_call(case_data& c, Run&& run) {
  const case_spec& spec = c.spec;
  const oracle_result ref = run_oracle(c);
  const naive_result naive = run_naive_fp32(c);
  padded_tensor<float> out(spec.batch, spec.hq, spec.lq, spec.v_dim(), spec.bshd, 1234.5f);
  std::vector<float> lse(static_cast<std::size_t>(spec.batch * spec.hq * spec.lq + 1), 1234.5f);
  alibi::attention_params p = c.params;
  p.logsumexp = alibi::make_view(lse.data(), spec.batch, spec.hq, spec.lq);
  run(static_cast<const case_data&>(c), static_cast<const alibi::attention_params&>(p), out.view);
  comparison r = compare(c, ref, naive, out, lse);
  if (lse.back() != 1234.5f) ++r.guard_writes;
  return r;
}

/// Runs `backend` on the case and compares it with the oracle.
template <class Backend>
comparison check_backend(const Backend& backend, const case_spec& spec) {
  case_data c(spec);
  return check_call(c, [&](const case_data& d, const alibi::attention_params& p,
                           const alibi::tensor_view<float, 4>& out) {
    alibi::attention(backend, d.q.view, d.k.view, d.v.view, out, p);
  });
}

/// The shared case list (design notes section 5), as a covering grid rather than the full
/// product: every length pair meets several head dims, head counts, masks and layouts.
inline std::vector<case_spec> grid_cases() {
  std::vector<case_spec> cases;
  const index_t lens[] = {1, 2, 3, 17, 97, 113, 127, 128, 129, 255};
  const index_t dims[] = {32, 64, 80, 96, 128, 1, 21, 59};
  const index_t heads[][2] = {{1, 1}, {3, 3}, {5, 5}, {8, 8}, {12, 12}, {16, 16}, {8, 2}, {8, 1}};
  std::uint64_t seed = 100;
  int n = 0;
  for (index_t lq : lens)
    for (int shape = 0; shape < 3; ++shape) {
      case_spec c;
      c.lq = lq;
      c.lk = shape == 0 ? lq : shape == 1 ? lq + 37 : std::max<index_t>(1, lq / 3);
      c.d = dims[n % 8];
      c.hq = heads[n % 8][0];
      c.hkv = heads[(n + 3) % 8][0] == c.hq ? heads[(n + 3) % 8][1] : heads[n % 8][1];
      if (c.hq % c.hkv != 0) c.hkv = c.hq;
      c.batch = 1 + n % 3;
      c.causal = n % 2 == 0;
      if (n % 5 == 3) {
        c.window_left = 7 + n % 11;
        c.window_right = c.causal ? -1 : 3;
      }
      c.bshd = n % 4 == 1;
      c.lengths = c.batch >= 3 || n % 7 == 2;
      c.key_mask = n % 6 == 5;
      c.offsets = n % 9 == 4;
      c.caller_slopes = n % 10 == 7;
      c.seed = seed++;
      cases.push_back(c);
      ++n;
    }
  // Long sequences and both q_len != k_len directions.
  for (auto [lq, lk, causal] : {std::tuple<index_t, index_t, bool>{1023, 1023, true},
                                {1025, 1025, false},
                                {1025, 1023, true},
                                {300, 1025, true},
                                {1023, 257, false}}) {
    case_spec c;
    c.lq = lq;
    c.lk = lk;
    c.causal = causal;
    c.d = 64;
    c.hq = 3;
    c.hkv = 3;
    c.seed = seed++;
    cases.push_back(c);
  }
  // Decoding: q_len 1..16 against a long cache (split-key path), with GQA.
  for (index_t lq : {1, 4, 16}) {
    case_spec c;
    c.lq = lq;
    c.lk = 4099;
    c.causal = true;
    c.d = 128;
    c.hq = 4;
    c.hkv = 1;
    c.seed = seed++;
    cases.push_back(c);
  }
  return cases;
}

/// v_head_dim != head_dim, with a key mask and GQA (2 query heads on 1 kv head), 2 entries.
inline case_spec value_dim_case() {
  case_spec c;
  c.lq = 65;
  c.lk = 300;
  c.d = 64;
  c.dv = 40;
  c.hq = 2;
  c.hkv = 1;
  c.key_mask = true;
  c.batch = 2;
  return c;
}

/// Inputs x3/x5 (nearly one-hot softmax), slope scales 0, 16 and -0.5, scales 0 and 1.2:
/// the cases beside the grid that every fused backend runs.
inline std::vector<case_spec> scale_cases() {
  std::vector<case_spec> cases;
  for (float vs : {3.0f, 5.0f}) {
    case_spec c;
    c.lq = 200;
    c.lk = 333;
    c.hq = 4;
    c.hkv = 2;
    c.d = 64;
    c.causal = true;
    c.value_scale = vs;  // logits ~ 25 sqrt(D): the softmax is nearly one-hot
    c.seed = 11;
    cases.push_back(c);
  }
  for (float ss : {0.0f, 16.0f, -0.5f}) {
    case_spec c;
    c.lq = 150;
    c.lk = 600;
    c.hq = 5;
    c.hkv = 5;
    c.d = 32;
    c.slope_scale = ss;
    c.seed = 12;
    cases.push_back(c);
  }
  for (float sc : {0.0f, 1.2f}) {
    case_spec c;
    c.lq = 77;
    c.lk = 77;
    c.hq = 3;
    c.hkv = 3;
    c.d = 96;
    c.scale = sc;
    c.seed = 13;
    cases.push_back(c);
  }
  return cases;
}

/// A buffer of host memory that a call's views point into (with padding, gaps and guards
/// around them). A runner that moves the call to a device copies it whole, so the device
/// sees the host's layout byte for byte (NaN padding included), and copies the buffers an
/// output lives in back whole (guards included, so out-of-bounds writes stay visible).
struct host_region {
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// One attention call on host data, as the shared edge-case bodies (edge_cases.hpp) hand it
/// to a runner: float q, k, v and out views, params whose views (lengths, offsets, key mask,
/// slopes, logsumexp, key norm bounds) point to host memory, and the buffers to move whole.
/// A view outside every listed buffer is moved element by element (NaN in its gaps).
struct host_call {
  alibi::tensor_view<const float, 4> q{}, k{}, v{};
  alibi::tensor_view<float, 4> out{};
  alibi::attention_params params{};
  std::vector<host_region> regions;

  template <class T>
  host_call& whole(const std::vector<T>& buf) {
    if (!buf.empty()) regions.push_back({buf.data(), buf.size() * sizeof(T)});
    return *this;
  }
};

/// Thrown by a device runner that cannot allocate the device copy of a call's memory: a test
/// that needs a very large allocation then skips with a warning, as it does where the host
/// refuses a large mapping.
struct staging_refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace alibi_test
