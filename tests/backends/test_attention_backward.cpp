// SPDX-License-Identifier: MIT
// The backward pass: the reference backward against finite differences of the reference
// forward (double), the fused CPU backward against the reference backward on the shared case
// grid (NaN-filled padding, guard elements, the tolerance rule), thread-count independence,
// far-tile skipping, dslopes, and argument errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/backend/eigen/attention_backward.hpp>
#include <alibi/backend/reference/attention_backward.hpp>

#include "backends.hpp"
#include "common.hpp"

using alibi::index_t;
using alibi_test::case_spec;

namespace {

/// attention_backward with the forward's logsumexp `lse` and the gradients in the order the
/// backward writes them: the cases below name each argument at the call.
alibi::attention_params with_lse(const alibi::attention_params& params,
                                 alibi::tensor_view<const float, 3> lse) {
  alibi::attention_params p = params;
  // The backward only reads params.logsumexp, whose type is the forward's output's.
  p.logsumexp = alibi::make_strided_view<float, 3>(
      const_cast<float*>(lse.data), {lse.extents[0], lse.extents[1], lse.extents[2]},
      {lse.strides[0], lse.strides[1], lse.strides[2]});
  return p;
}

template <class Backend, class TQ, class TK, class TV, class TO, class TD, class TG>
void backward_with(const Backend& be, alibi::tensor_view<TQ, 4> q, alibi::tensor_view<TK, 4> k,
                   alibi::tensor_view<TV, 4> v, alibi::tensor_view<TO, 4> out,
                   alibi::tensor_view<TD, 4> dout, alibi::tensor_view<const float, 3> lse,
                   alibi::tensor_view<TG, 4> dq, alibi::tensor_view<TG, 4> dk,
                   alibi::tensor_view<TG, 4> dv, const alibi::attention_params& params,
                   alibi::tensor_view<float, 2> dslopes = {},
                   alibi::tensor_view<const float, 3> dlse = {}) {
  alibi::attention_gradients<TG> g;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  g.dslopes = dslopes;
  g.dlogsumexp = dlse;
  alibi::attention_backward(be, q, k, v, out, dout, with_lse(params, lse), g);
}

template <class Backend, class TQ, class TK, class TV, class TO, class TD, class TG>
alibi::status can_implement_backward_with(
    const Backend& be, alibi::tensor_view<TQ, 4> q, alibi::tensor_view<TK, 4> k,
    alibi::tensor_view<TV, 4> v, alibi::tensor_view<TO, 4> out, alibi::tensor_view<TD, 4> dout,
    alibi::tensor_view<const float, 3> lse, alibi::tensor_view<TG, 4> dq,
    alibi::tensor_view<TG, 4> dk, alibi::tensor_view<TG, 4> dv,
    const alibi::attention_params& params) {
  alibi::attention_gradients<TG> g;
  g.dq = dq;
  g.dk = dk;
  g.dv = dv;
  return alibi::can_implement_backward(be, q, k, v, out, dout, with_lse(params, lse), g);
}

// ---------------------------------------------------------------------------------------
// Finite differences (double).

/// A small problem in double precision, dense (batch, heads, seq, dim).
struct fd_problem {
  index_t B = 2, Hq = 4, Hkv = 2, Lq = 5, Lk = 7, D = 3, Dv = 2;
  std::vector<double> q, k, v, dout;
  std::vector<float> slopes;  // (slope_rows, Hq), multiples of 2^-11 (see dslopes below)
  index_t slope_rows = 0;
  bool with_dlse = false;
  std::vector<float> dlse;  // (B, Hq, Lq) d loss / d logsumexp, when with_dlse
  alibi::attention_params params;
  std::vector<index_t> q_lengths, k_lengths, q_offsets, k_offsets;
  std::vector<char> key_mask;

  void init(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> randn(0.0, 1.0);
    auto fill = [&](std::vector<double>& x, index_t n) {
      x.resize(static_cast<std::size_t>(n));
      for (double& e : x) e = randn(rng);
    };
    fill(q, B * Hq * Lq * D);
    fill(k, B * Hkv * Lk * D);
    fill(v, B * Hkv * Lk * Dv);
    fill(dout, B * Hq * Lq * Dv);
    if (with_dlse) {
      dlse.resize(static_cast<std::size_t>(B * Hq * Lq));
      for (float& g : dlse) g = static_cast<float>(randn(rng));
    }
    if (slope_rows > 0) {
      std::uniform_int_distribution<int> u(0, 1200);
      slopes.resize(static_cast<std::size_t>(slope_rows * Hq));
      for (float& s : slopes) s = static_cast<float>(u(rng)) / 2048.0f;
      params.slopes = slope_rows == 1 ? alibi::slope_config::per_head(slopes.data(), Hq)
                                      : alibi::slope_config::per_batch_head(slopes.data(), B, Hq);
    }
  }

  /// loss = sum(out * dout) (+ sum(lse * dlse) with_dlse), so that d loss / d out = dout and
  /// d loss / d lse = dlse.
  double loss() {
    std::vector<double> out(static_cast<std::size_t>(B * Hq * Lq * Dv));
    const auto qv = alibi::make_view(q.data(), B, Hq, Lq, D);
    const auto kv = alibi::make_view(k.data(), B, Hkv, Lk, D);
    const auto vv = alibi::make_view(v.data(), B, Hkv, Lk, Dv);
    const auto ov = alibi::make_view(out.data(), B, Hq, Lq, Dv);
    alibi::attention(alibi::backend::reference{}, qv, kv, vv, ov, params);
    double l = 0;
    for (std::size_t e = 0; e < out.size(); ++e) l += out[e] * dout[e];
    if (with_dlse) l += lse_loss(qv, kv, vv, ov);
    return l;
  }

  /// sum over rows with keys of dlse * the row's logsumexp, in double (the forward's view is
  /// float, too coarse for a difference quotient): log sum exp(scale q.k - slope |i - j|)
  /// over the allowed keys.
  template <class Q, class K, class V, class O>
  double lse_loss(const Q& qv, const K& kv, const V& vv, const O& ov) const {
    alibi::detail::attention_problem p;
    alibi::detail::make_problem(qv, kv, vv, ov, params, true, p).throw_if_failed();
    double l = 0;
    std::vector<double> row(static_cast<std::size_t>(Lk));
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < Hq; ++h)
        for (index_t i = 0; i < p.len_q(b); ++i) {
          const alibi::index_range keys = p.key_range(b, i);
          double m = -std::numeric_limits<double>::infinity();
          for (index_t j = keys.begin; j < keys.end; ++j) {
            if (p.key_excluded(b, j)) continue;
            double dot = 0;
            for (index_t d = 0; d < D; ++d) dot += qv(b, h, i, d) * kv(b, p.kv_head(h), j, d);
            row[static_cast<std::size_t>(j)] =
                static_cast<double>(p.scale) * dot +
                (p.slopes.enabled
                     ? alibi::alibi_bias_exact(p.slope(b, h), p.q_offset(b) + i, p.k_offset(b) + j)
                     : 0.0);
            m = std::max(m, row[static_cast<std::size_t>(j)]);
          }
          if (m == -std::numeric_limits<double>::infinity()) continue;  // no keys: lse -inf
          double sum = 0;
          for (index_t j = keys.begin; j < keys.end; ++j)
            if (!p.key_excluded(b, j)) sum += std::exp(row[static_cast<std::size_t>(j)] - m);
          l += static_cast<double>(dlse[static_cast<std::size_t>((b * Hq + h) * Lq + i)]) *
               (m + std::log(sum));
        }
    return l;
  }
};

/// Richardson-extrapolated central difference of f at x (error O(h^4)).
double derivative(const std::function<double(double)>& f, double x, double h) {
  const double d1 = (f(x + h) - f(x - h)) / (2 * h);
  const double d2 = (f(x + h / 2) - f(x - h / 2)) / h;
  return (4 * d2 - d1) / 3;
}

/// max |a - b| / max(max |b|, 1e-12).
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double err = 0, scale = 1e-12;
  for (std::size_t e = 0; e < a.size(); ++e) {
    err = std::max(err, std::abs(a[e] - b[e]));
    scale = std::max(scale, std::abs(b[e]));
  }
  return err / scale;
}

void check_finite_differences(fd_problem& pr) {
  std::vector<double> dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size()), o(pr.dout.size());
  std::vector<float> lse(static_cast<std::size_t>(pr.B * pr.Hq * pr.Lq));
  std::vector<float> dslopes(static_cast<std::size_t>(std::max<index_t>(pr.slope_rows, 1) * pr.Hq),
                             1e30f);
  auto qv = alibi::make_view(pr.q.data(), pr.B, pr.Hq, pr.Lq, pr.D);
  auto kv = alibi::make_view(pr.k.data(), pr.B, pr.Hkv, pr.Lk, pr.D);
  auto vv = alibi::make_view(pr.v.data(), pr.B, pr.Hkv, pr.Lk, pr.Dv);
  auto ov = alibi::make_view(o.data(), pr.B, pr.Hq, pr.Lq, pr.Dv);
  alibi::attention_params p = pr.params;
  p.logsumexp = alibi::make_view(lse.data(), pr.B, pr.Hq, pr.Lq);
  alibi::attention(alibi::backend::reference{}, qv, kv, vv, ov, p);
  alibi::tensor_view<float, 2> dsv{};
  if (pr.slope_rows > 0) dsv = alibi::make_view(dslopes.data(), pr.slope_rows, pr.Hq);
  alibi::tensor_view<const float, 3> dlse{};
  if (pr.with_dlse) dlse = alibi::make_view<const float>(pr.dlse.data(), pr.B, pr.Hq, pr.Lq);
  backward_with(alibi::backend::reference{}, qv, kv, vv, ov,
                alibi::make_view(pr.dout.data(), pr.B, pr.Hq, pr.Lq, pr.Dv), p.logsumexp,
                alibi::make_view(dq.data(), pr.B, pr.Hq, pr.Lq, pr.D),
                alibi::make_view(dk.data(), pr.B, pr.Hkv, pr.Lk, pr.D),
                alibi::make_view(dv.data(), pr.B, pr.Hkv, pr.Lk, pr.Dv), p, dsv, dlse);
  auto numeric = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    for (std::size_t e = 0; e < x.size(); ++e) {
      const double saved = x[e];
      g[e] = derivative(
          [&](double val) {
            x[e] = val;
            return pr.loss();
          },
          saved, 1e-3);
      x[e] = saved;
    }
    return g;
  };
  CHECK(rel_error(dq, numeric(pr.q)) < 1e-6);
  CHECK(rel_error(dk, numeric(pr.k)) < 1e-6);
  CHECK(rel_error(dv, numeric(pr.v)) < 1e-6);
  if (pr.slope_rows > 0) {
    // Slopes are floats: a step of 2^-11 and 2^-12 around a multiple of 2^-11 is exact.
    std::vector<double> got(dslopes.begin(), dslopes.end()), want(dslopes.size());
    for (std::size_t e = 0; e < pr.slopes.size(); ++e) {
      const float saved = pr.slopes[e];
      want[e] = derivative(
          [&](double val) {
            pr.slopes[e] = static_cast<float>(val);
            return pr.loss();
          },
          saved, 1.0 / 2048);
      pr.slopes[e] = saved;
    }
    // dslopes is float (the slopes' type): relative to its scale, float rounding.
    CHECK(rel_error(got, want) < 1e-6);
  }
}

}  // namespace

TEST_CASE("reference backward matches finite differences", "[backward][reference]") {
  struct variant {
    const char* name;
    std::function<void(fd_problem&)> setup;
  };
  const variant variants[] = {
      {"no mask, GQA 4/2", [](fd_problem&) {}},
      {"causal, MQA",
       [](fd_problem& p) {
         p.Hkv = 1;
         p.params.mask.causal = true;
       }},
      {"window, q_len > k_len",
       [](fd_problem& p) {
         p.Lq = 8;
         p.Lk = 4;
         p.params.mask.window_left = 2;
         p.params.mask.window_right = 1;
       }},
      {"lengths (one entry without keys), causal",
       [](fd_problem& p) {
         p.B = 3;
         p.params.mask.causal = true;
         p.q_lengths = {5, 3, 0};
         p.k_lengths = {7, 0, 4};
       }},
      {"offsets and key mask",
       [](fd_problem& p) {
         p.q_offsets = {100, 3};
         p.k_offsets = {97, 0};
         p.key_mask = {0, 1, 0, 0, 1, 0, 0, /**/ 1, 1, 1, 1, 1, 1, 1};
       }},
      {"caller slopes per head, dslopes", [](fd_problem& p) { p.slope_rows = 1; }},
      {"caller slopes per batch and head, causal window, dslopes",
       [](fd_problem& p) {
         p.slope_rows = 2;
         p.params.mask.causal = true;
         p.params.mask.window_left = 3;
       }},
      {"scale 0.7, no ALiBi",
       [](fd_problem& p) {
         p.params.scale = 0.7f;
         p.params.slopes = alibi::slope_config::none();
       }},
      {"a loss on the logsumexp too, GQA, dslopes",
       [](fd_problem& p) {
         p.with_dlse = true;
         p.slope_rows = 1;
       }},
      {"a loss on the logsumexp, lengths (one entry without keys), key mask, causal window",
       [](fd_problem& p) {
         p.with_dlse = true;
         p.B = 3;
         p.params.mask.causal = true;
         p.params.mask.window_left = 3;
         p.q_lengths = {5, 3, 4};
         p.k_lengths = {7, 0, 6};
         p.key_mask = {0, 1, 0, 0, 1, 0, 0, /**/ 0, 0, 0, 0, 0, 0, 0, /**/ 1, 0, 0, 1, 0, 0, 0};
       }},
  };
  std::uint64_t seed = 7;
  for (const variant& var : variants) {
    INFO(var.name);
    fd_problem p;
    var.setup(p);
    if (!p.q_lengths.empty()) {
      p.params.q_lengths = alibi::make_view<const index_t>(p.q_lengths.data(), p.B);
      p.params.k_lengths = alibi::make_view<const index_t>(p.k_lengths.data(), p.B);
    }
    if (!p.q_offsets.empty()) {
      p.params.q_offsets = alibi::make_view<const index_t>(p.q_offsets.data(), p.B);
      p.params.k_offsets = alibi::make_view<const index_t>(p.k_offsets.data(), p.B);
    }
    if (!p.key_mask.empty())
      p.params.key_mask =
          alibi::make_view<const bool>(reinterpret_cast<const bool*>(p.key_mask.data()), p.B, p.Lk);
    p.init(seed++);
    check_finite_differences(p);
  }
}

namespace {

// ---------------------------------------------------------------------------------------
// The fused backward against the reference backward.

/// The gradients of one backend on one case, in padded tensors (NaN or a sentinel outside).
struct grads {
  alibi_test::padded_tensor<float> dq, dk, dv;
  std::vector<float> dslopes;
  grads(const case_spec& s, float fill)
      : dq(s.batch, s.hq, s.lq, s.d, s.bshd, fill),
        dk(s.batch, s.hkv, s.lk, s.d, s.bshd, fill),
        dv(s.batch, s.hkv, s.lk, s.v_dim(), s.bshd, fill),
        dslopes(static_cast<std::size_t>(s.batch * s.hq + 1), fill) {}
};

/// Everything a backward call on one case needs: the case's inputs (NaN padding), the
/// forward's out and logsumexp from the fused forward, dout (NaN on padded rows) and, for
/// every other seed, a gradient of the logsumexp (NaN on padded rows).
struct backward_case {
  alibi_test::case_data c;
  alibi_test::padded_tensor<float> out, dout;
  std::vector<float> lse, dlse;
  alibi::attention_params params;
  bool with_dslopes = false;

  explicit backward_case(const case_spec& s)
      : c(s),
        out(s.batch, s.hq, s.lq, s.v_dim(), s.bshd, alibi_test::nan_f),
        dout(s.batch, s.hq, s.lq, s.v_dim(), s.bshd, alibi_test::nan_f),
        lse(static_cast<std::size_t>(s.batch * s.hq * s.lq)) {
    params = c.params;
    params.logsumexp = alibi::make_view(lse.data(), s.batch, s.hq, s.lq);
    alibi::attention(alibi::backend::eigen{2}, c.q.view, c.k.view, c.v.view, out.view, params);
    std::mt19937_64 rng(s.seed + 1000);
    std::normal_distribution<float> randn(0.0f, 1.0f);
    dout.for_each([&](float& x, index_t b, index_t, index_t i, index_t) {
      const bool padded = !c.q_lengths.empty() && i >= c.q_lengths[static_cast<std::size_t>(b)];
      x = padded ? alibi_test::nan_f : randn(rng);  // padded rows' dout is never read
    });
    with_dslopes = !s.no_alibi;
    if (s.seed % 2 == 0) {
      dlse.resize(lse.size());
      for (index_t b = 0; b < s.batch; ++b)
        for (index_t h = 0; h < s.hq; ++h)
          for (index_t i = 0; i < s.lq; ++i) {
            const bool padded =
                !c.q_lengths.empty() && i >= c.q_lengths[static_cast<std::size_t>(b)];
            dlse[static_cast<std::size_t>((b * s.hq + h) * s.lq + i)] =
                padded ? alibi_test::nan_f : randn(rng);
          }
    }
  }

  /// The logsumexp's gradient as the backward takes it (empty for odd seeds).
  alibi::tensor_view<const float, 3> dlse_view() const {
    if (dlse.empty()) return {};
    return alibi::make_view<const float>(dlse.data(), c.spec.batch, c.spec.hq, c.spec.lq);
  }

  /// Row i's gradient of the logsumexp (0 without one).
  float dlse_at(index_t b, index_t h, index_t i) const {
    return dlse.empty() ? 0.0f
                        : dlse[static_cast<std::size_t>((b * c.spec.hq + h) * c.spec.lq + i)];
  }

  template <class Backend>
  void run(const Backend& be, grads& g, bool skip = true, alibi::attention_stats* stats = nullptr) {
    alibi::attention_params p = params;
    p.skip_far_tiles = skip;
    p.stats = stats;
    const index_t rows = c.spec.caller_slopes ? c.spec.batch : 1;
    alibi::tensor_view<float, 2> ds{};
    if (with_dslopes) ds = alibi::make_view(g.dslopes.data(), rows, c.spec.hq);
    backward_with(be, c.q.view, c.k.view, c.v.view, out.view, dout.view, p.logsumexp, g.dq.view,
                  g.dk.view, g.dv.view, p, ds, dlse_view());
  }
};

/// The reference gradients in double plus the naive fp32 backward's error and the size of
/// the terms each gradient sums (for the rounding floor).
struct backward_oracle {
  std::vector<double> dq, dk, dv, dslopes;  // dense
  std::vector<double> dq_terms, dk_terms, dv_terms, dslope_terms;
  double naive_dq = 0, naive_dk = 0, naive_dv = 0, naive_dslopes = 0;
  double score_scale = 0;
};

/// The seeds' algorithm differentiated in fp32 (float scores, softmax and sums): the
/// precision a straightforward fp32 backward achieves, which sets the tolerance.
backward_oracle make_oracle(backward_case& bc) {
  const case_spec& s = bc.c.spec;
  backward_oracle o;
  const index_t nq = s.batch * s.hq * s.lq * s.d, nk = s.batch * s.hkv * s.lk * s.d;
  const index_t nv = s.batch * s.hkv * s.lk * s.v_dim();
  const index_t rows = s.caller_slopes ? s.batch : 1;
  o.dq.assign(static_cast<std::size_t>(nq), 0);
  o.dk.assign(static_cast<std::size_t>(nk), 0);
  o.dv.assign(static_cast<std::size_t>(nv), 0);
  o.dslopes.assign(static_cast<std::size_t>(rows * s.hq), 0);
  alibi::tensor_view<double, 2> dsv{};
  std::vector<float> dsf(o.dslopes.size());
  alibi::tensor_view<float, 2> dsfv{};
  if (bc.with_dslopes) dsfv = alibi::make_view(dsf.data(), rows, s.hq);
  backward_with(alibi::backend::reference{}, bc.c.q.view, bc.c.k.view, bc.c.v.view, bc.out.view,
                bc.dout.view, bc.params.logsumexp,
                alibi::make_view(o.dq.data(), s.batch, s.hq, s.lq, s.d),
                alibi::make_view(o.dk.data(), s.batch, s.hkv, s.lk, s.d),
                alibi::make_view(o.dv.data(), s.batch, s.hkv, s.lk, s.v_dim()), bc.params, dsfv,
                bc.dlse_view());
  (void)dsv;
  for (std::size_t e = 0; e < dsf.size(); ++e) o.dslopes[e] = dsf[e];

  // The naive fp32 backward, with the absolute terms of each sum in double.
  alibi::detail::attention_problem p;
  alibi::detail::make_problem(bc.c.q.view, bc.c.k.view, bc.c.v.view, bc.out.view, bc.params, true,
                              p)
      .throw_if_failed();
  std::vector<float> ndq(o.dq.size(), 0), ndk(o.dk.size(), 0), ndv(o.dv.size(), 0);
  std::vector<double> nds(o.dslopes.size(), 0);
  o.dq_terms.assign(o.dq.size(), 0);
  o.dk_terms.assign(o.dk.size(), 0);
  o.dv_terms.assign(o.dv.size(), 0);
  o.dslope_terms.assign(o.dslopes.size(), 0);
  auto qi = [&](index_t b, index_t h, index_t i, index_t d) {
    return static_cast<std::size_t>(((b * s.hq + h) * s.lq + i) * s.d + d);
  };
  auto ki = [&](index_t b, index_t h, index_t j, index_t d, index_t dim) {
    return static_cast<std::size_t>(((b * s.hkv + h) * s.lk + j) * dim + d);
  };
  std::vector<float> pr(static_cast<std::size_t>(s.lk)), dp(static_cast<std::size_t>(s.lk));
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.hq; ++h) {
      const index_t hk = p.kv_head(h), sr = rows == 1 ? 0 : b;
      for (index_t i = 0; i < p.len_q(b); ++i) {
        const alibi::index_range kr = p.key_range(b, i);
        float m = -std::numeric_limits<float>::infinity();
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (p.key_excluded(b, j)) continue;
          pr[j] = alibi_test::naive_score(p, bc.c, b, h, i, j);
          m = std::max(m, pr[j]);
        }
        if (m == -std::numeric_limits<float>::infinity()) continue;
        o.score_scale = std::max(o.score_scale, std::abs(static_cast<double>(m)));
        float sum = 0, delta = 0;
        for (index_t j = kr.begin; j < kr.end; ++j)
          if (!p.key_excluded(b, j)) sum += (pr[j] = std::exp(pr[j] - m));
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (p.key_excluded(b, j)) continue;
          pr[j] /= sum;
          float x = 0;
          for (index_t d = 0; d < s.v_dim(); ++d)
            x += bc.dout.view(b, h, i, d) * bc.c.v.view(b, hk, j, d);
          dp[j] = x;
          delta += pr[j] * x;
        }
        // A loss on the logsumexp: dS_ij = P_ij (dP_ij - D_i + dlse_i).
        const float g_lse = bc.dlse_at(b, h, i);
        const double delta_abs = std::abs(delta) + std::abs(g_lse);
        delta -= g_lse;
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (p.key_excluded(b, j)) continue;
          const float ds = pr[j] * (dp[j] - delta);
          // |dS| with its inputs' sizes: P (|dP| + |D| + |dlse|), the size of the terms that
          // cancel.
          const double ds_abs = static_cast<double>(pr[j]) * (std::abs(dp[j]) + delta_abs);
          const index_t qp = p.q_offset(b) + i, kp = p.k_offset(b) + j;
          const double dist = static_cast<double>(qp > kp ? qp - kp : kp - qp);
          nds[static_cast<std::size_t>(sr * s.hq + h)] -= static_cast<double>(ds) * dist;
          o.dslope_terms[static_cast<std::size_t>(sr * s.hq + h)] += ds_abs * dist;
          for (index_t d = 0; d < s.d; ++d) {
            ndq[qi(b, h, i, d)] += p.scale * ds * bc.c.k.view(b, hk, j, d);
            ndk[ki(b, hk, j, d, s.d)] += p.scale * ds * bc.c.q.view(b, h, i, d);
            o.dq_terms[qi(b, h, i, d)] += std::abs(p.scale * ds_abs * bc.c.k.view(b, hk, j, d));
            o.dk_terms[ki(b, hk, j, d, s.d)] +=
                std::abs(p.scale * ds_abs * bc.c.q.view(b, h, i, d));
          }
          for (index_t d = 0; d < s.v_dim(); ++d) {
            ndv[ki(b, hk, j, d, s.v_dim())] += pr[j] * bc.dout.view(b, h, i, d);
            o.dv_terms[ki(b, hk, j, d, s.v_dim())] += std::abs(pr[j] * bc.dout.view(b, h, i, d));
          }
        }
      }
    }
  auto err = [](const std::vector<float>& a, const std::vector<double>& ref) {
    double e = 0;
    for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - ref[i]));
    return e;
  };
  o.naive_dq = err(ndq, o.dq);
  o.naive_dk = err(ndk, o.dk);
  o.naive_dv = err(ndv, o.dv);
  for (std::size_t e = 0; e < nds.size(); ++e)
    o.naive_dslopes = std::max(o.naive_dslopes, std::abs(nds[e] - o.dslopes[e]));
  return o;
}

/// One gradient tensor against the oracle under the tolerance rule: max |got - ref| <= 2 *
/// the naive fp32 error + 8 ulps of the gradient's scale + the score rounding of fp32 (a
/// score off by ~2^-23 |row max| moves each probability by that relative amount, and each
/// gradient element by that times the absolute sum of its terms).
struct grad_check {
  double max_err = 0, tolerance = 0;
  index_t nans = 0, guard_writes = 0;
  bool ok() const { return nans == 0 && guard_writes == 0 && max_err <= tolerance; }
};

grad_check compare_grad(const alibi_test::padded_tensor<float>& got, const std::vector<double>& ref,
                        const std::vector<double>& terms, double naive_err, double score_scale) {
  constexpr double eps = std::numeric_limits<float>::epsilon();
  grad_check r;
  double scale = 0, term_max = 0;
  for (double x : ref) scale = std::max(scale, std::abs(x));
  for (double x : terms) term_max = std::max(term_max, x);
  r.tolerance =
      2 * naive_err + 8 * eps * std::max(1.0, scale) + 4 * eps * (score_scale + 16) * term_max;
  std::size_t e = 0;
  const auto& v = got.view;
  for (index_t b = 0; b < v.extents[0]; ++b)
    for (index_t h = 0; h < v.extents[1]; ++h)
      for (index_t i = 0; i < v.extents[2]; ++i)
        for (index_t d = 0; d < v.extents[3]; ++d, ++e) {
          const float x = v(b, h, i, d);
          if (std::isnan(x)) ++r.nans;
          r.max_err = std::max(r.max_err, std::abs(static_cast<double>(x) - ref[e]));
        }
  r.guard_writes = got.touched_outside();
  return r;
}

void check_against_oracle(backward_case& bc, const backward_oracle& o, grads& g) {
  const case_spec& s = bc.c.spec;
  const grad_check cq = compare_grad(g.dq, o.dq, o.dq_terms, o.naive_dq, o.score_scale);
  const grad_check ck = compare_grad(g.dk, o.dk, o.dk_terms, o.naive_dk, o.score_scale);
  const grad_check cv = compare_grad(g.dv, o.dv, o.dv_terms, o.naive_dv, o.score_scale);
  INFO("dq err " << cq.max_err << " tol " << cq.tolerance << " nans " << cq.nans << " guard "
                 << cq.guard_writes);
  INFO("dk err " << ck.max_err << " tol " << ck.tolerance << " nans " << ck.nans << " guard "
                 << ck.guard_writes);
  INFO("dv err " << cv.max_err << " tol " << cv.tolerance << " nans " << cv.nans << " guard "
                 << cv.guard_writes);
  CHECK(cq.ok());
  CHECK(ck.ok());
  CHECK(cv.ok());
  if (bc.with_dslopes) {
    constexpr double eps = std::numeric_limits<float>::epsilon();
    const index_t rows = s.caller_slopes ? s.batch : 1;
    double err = 0, scale = 0, terms = 0;
    for (index_t e = 0; e < rows * s.hq; ++e) {
      err = std::max(err, std::abs(g.dslopes[static_cast<std::size_t>(e)] -
                                   o.dslopes[static_cast<std::size_t>(e)]));
      scale = std::max(scale, std::abs(o.dslopes[static_cast<std::size_t>(e)]));
      terms = std::max(terms, o.dslope_terms[static_cast<std::size_t>(e)]);
    }
    const double tol = 2 * o.naive_dslopes + 8 * eps * std::max(1.0, scale) +
                       4 * eps * (o.score_scale + 16) * terms;
    INFO("dslopes err " << err << " tol " << tol);
    CHECK(err <= tol);
    CHECK(g.dslopes[static_cast<std::size_t>(rows * s.hq)] == 1234.5f);  // guard
  }
}

template <class T>
bool bitwise_equal(const alibi_test::padded_tensor<T>& a, const alibi_test::padded_tensor<T>& b) {
  return std::memcmp(a.buf.data(), b.buf.data(), a.buf.size() * sizeof(T)) == 0;
}

void run_grid(const std::vector<case_spec>& cases, bool three_threads) {
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    backward_case bc(spec);
    const backward_oracle o = make_oracle(bc);
    grads g1(spec, 1234.5f), g2(spec, 1234.5f), g3(spec, 1234.5f), noskip(spec, 1234.5f);
    bc.run(alibi::backend::eigen{1}, g1);
    bc.run(alibi::backend::eigen{2}, g2);
    {
      INFO("eigen, skipping on");
      check_against_oracle(bc, o, g1);
    }
    bc.run(alibi::backend::eigen{2}, noskip, false);
    {
      INFO("eigen, skipping off");
      check_against_oracle(bc, o, noskip);
    }
    CHECK(bitwise_equal(g1.dq, g2.dq));
    CHECK(bitwise_equal(g1.dk, g2.dk));
    CHECK(bitwise_equal(g1.dv, g2.dv));
    CHECK(g1.dslopes == g2.dslopes);
    if (three_threads) {
      bc.run(alibi::backend::eigen{3}, g3);
      CHECK(bitwise_equal(g1.dq, g3.dq));
      CHECK(bitwise_equal(g1.dk, g3.dk));
      CHECK(bitwise_equal(g1.dv, g3.dv));
      CHECK(g1.dslopes == g3.dslopes);
    }
  }
}

}  // namespace

TEST_CASE("eigen backward matches the reference backward on small cases", "[backward][eigen]") {
  std::vector<case_spec> cases;
  std::uint64_t seed = 500;
  for (index_t lq : {1, 3, 17, 40})
    for (int variant = 0; variant < 4; ++variant) {
      case_spec c;
      c.lq = lq;
      c.lk = variant % 2 == 0 ? lq : lq + 9;
      c.hq = 4;
      c.hkv = variant == 3 ? 1 : 2;
      c.d = variant == 2 ? 21 : 32;
      c.batch = 3;
      c.causal = variant != 1;
      c.lengths = variant == 0;
      c.key_mask = variant == 1;
      c.offsets = variant == 2;
      c.caller_slopes = variant == 3;
      c.bshd = variant % 2 == 1;
      c.seed = seed++;
      cases.push_back(c);
    }
  run_grid(cases, true);
}

TEST_CASE("eigen backward matches the reference backward on the case grid",
          "[backward][eigen][grid][heavy]") {
  run_grid(alibi_test::grid_cases(), false);
}

TEST_CASE("eigen backward on large inputs, large slopes, custom scales",
          "[backward][eigen][grid][heavy]") {
  std::vector<case_spec> cases = alibi_test::scale_cases();
  cases.push_back(alibi_test::value_dim_case());
  run_grid(cases, true);
}

namespace {

/// Dense (1, H, L, D) inputs for the skipping and NaN tests, with the fused forward's out
/// and logsumexp.
struct dense_case {
  index_t H, L, D;
  std::vector<float> q, k, v, out, dout, lse;
  std::vector<float> dlse;  // (1, H, L) the logsumexp's gradient, or empty for none
  alibi::attention_params p;
  dense_case(index_t h, index_t l, index_t d, bool causal, std::uint64_t seed) : H(h), L(l), D(d) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> randn(0.0f, 1.0f);
    for (auto* x : {&q, &k, &v, &dout}) {
      x->resize(static_cast<std::size_t>(H * L * D));
      for (float& e : *x) e = randn(rng);
    }
    out.resize(q.size());
    lse.resize(static_cast<std::size_t>(H * L));
    p.mask.causal = causal;
    p.logsumexp = alibi::make_view(lse.data(), 1, H, L);
    forward();
  }
  alibi::tensor_view<float, 4> view(std::vector<float>& x) {
    return alibi::make_view(x.data(), 1, H, L, D);
  }
  void forward() {
    alibi::attention(alibi::backend::eigen{2}, view(q), view(k), view(v), view(out), p);
  }
  template <class Backend, class G>
  void backward(const Backend& be, std::vector<G>& dq, std::vector<G>& dk, std::vector<G>& dv,
                std::vector<float>* dslopes, bool skip, alibi::attention_stats* stats = nullptr) {
    dq.assign(q.size(), G(0));
    dk.assign(q.size(), G(0));
    dv.assign(q.size(), G(0));
    alibi::attention_params pp = p;
    pp.skip_far_tiles = skip;
    pp.stats = stats;
    alibi::tensor_view<float, 2> ds{};
    if (dslopes) {
      dslopes->assign(static_cast<std::size_t>(H), 0.0f);
      ds = alibi::make_view(dslopes->data(), 1, H);
    }
    auto g = [&](std::vector<G>& x) { return alibi::make_view(x.data(), 1, H, L, D); };
    const auto dl = dlse.empty() ? alibi::tensor_view<const float, 3>{}
                                 : alibi::make_view<const float>(dlse.data(), 1, H, L);
    backward_with(be, view(q), view(k), view(v), view(out), view(dout), p.logsumexp, g(dq), g(dk),
                  g(dv), pp, ds, dl);
  }
};

double row_norm(const std::vector<float>& x, index_t row, index_t d) {
  double s = 0;
  for (index_t e = 0; e < d; ++e)
    s += static_cast<double>(x[static_cast<std::size_t>(row * d + e)]) *
         x[static_cast<std::size_t>(row * d + e)];
  return std::sqrt(s);
}

}  // namespace

TEST_CASE("backward far-tile skipping skips work and stays within its proven bound",
          "[backward][skip]") {
  // 8 heads (slopes 1/2 .. 1/256), causal, 1536 rows: the steep heads skip most far tiles.
  // Then the same with a logsumexp gradient g (a z-loss's 2 z lse_i, here N(0, 4)).
  const bool with_dlse = GENERATE(false, true);
  INFO("a logsumexp gradient given: " << with_dlse);
  dense_case c(8, 1536, 32, true, 21);
  if (with_dlse) {
    std::mt19937_64 rng(77);
    std::normal_distribution<float> randn(0.0f, 2.0f);
    c.dlse.resize(c.lse.size());
    for (float& x : c.dlse) x = randn(rng);
  }
  std::vector<float> dq0, dk0, dv0, ds0, dq1, dk1, dv1, ds1;
  alibi::attention_stats on, off;
  c.backward(alibi::backend::eigen{2}, dq0, dk0, dv0, &ds0, false, &off);
  c.backward(alibi::backend::eigen{2}, dq1, dk1, dv1, &ds1, true, &on);
  CHECK(off.tiles_skipped == 0);
  CHECK(on.tiles_skipped > on.tiles_computed / 4);
  CHECK(on.tiles_skipped + on.tiles_computed == off.tiles_computed);
  // The bound (docs/far-tile-skipping.md, "In the backward pass"): a row loses at most 2^-24 of its
  // probability (2^-25 per side, each skipped weight at most 2^-25), |dP_ij - D_i + g_i| <=
  // 2 |dO_i| max|v| + |g_i| = e_i.
  const double eps25 = std::ldexp(1.0, -25), scale = 1.0 / std::sqrt(32.0);
  double vmax = 0, kmax = 0;
  for (index_t r = 0; r < c.H * c.L; ++r) {
    vmax = std::max(vmax, row_norm(c.v, r, c.D));
    kmax = std::max(kmax, row_norm(c.k, r, c.D));
  }
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (index_t h = 0; h < c.H; ++h) {
    double sum_do = 0, sum_e = 0, sum_e_q = 0, max_dq_bound = 0, max_grad[3] = {0, 0, 0};
    for (index_t i = 0; i < c.L; ++i) {
      const double dn = row_norm(c.dout, h * c.L + i, c.D);
      const double e_i =
          2 * dn * vmax +
          (with_dlse ? std::fabs(static_cast<double>(c.dlse[static_cast<std::size_t>(h * c.L + i)]))
                     : 0.0);
      sum_do += dn;
      sum_e += e_i;
      sum_e_q += e_i * row_norm(c.q, h * c.L + i, c.D);
      max_dq_bound = std::max(max_dq_bound, scale * 2 * eps25 * e_i * kmax);
    }
    double err[3] = {0, 0, 0};
    for (index_t e = h * c.L * c.D; e < (h + 1) * c.L * c.D; ++e) {
      const auto u = static_cast<std::size_t>(e);
      err[0] = std::max(err[0], static_cast<double>(std::abs(dq1[u] - dq0[u])));
      err[1] = std::max(err[1], static_cast<double>(std::abs(dk1[u] - dk0[u])));
      err[2] = std::max(err[2], static_cast<double>(std::abs(dv1[u] - dv0[u])));
      max_grad[0] = std::max(max_grad[0], static_cast<double>(std::abs(dq0[u])));
      max_grad[1] = std::max(max_grad[1], static_cast<double>(std::abs(dk0[u])));
      max_grad[2] = std::max(max_grad[2], static_cast<double>(std::abs(dv0[u])));
    }
    const double bounds[3] = {max_dq_bound, scale * eps25 * sum_e_q, eps25 * sum_do};
    for (int g = 0; g < 3; ++g) {
      INFO("head " << h << " gradient " << g << ": change " << err[g] << ", bound " << bounds[g]
                   << " + rounding " << 64 * eps * max_grad[g]);
      // Plus rounding: fewer terms in an fp32 sum change its last bits.
      CHECK(err[g] <= bounds[g] + 64 * eps * max_grad[g]);
    }
    const double ds_bound = 2 * eps25 * sum_e;
    INFO("dslopes head " << h << ": " << ds1[static_cast<std::size_t>(h)] << " vs "
                         << ds0[static_cast<std::size_t>(h)]);
    CHECK(std::abs(ds1[static_cast<std::size_t>(h)] - ds0[static_cast<std::size_t>(h)]) <=
          ds_bound + 1e-5 * std::abs(ds0[static_cast<std::size_t>(h)]));
  }
}

TEST_CASE("backward: NaN in used inputs reaches exactly the gradients it flows to",
          "[backward][nan]") {
  // One NaN in a K row, a V row, a Q row, a dout row, causal: rows that never see the
  // NaN key (before it) and keys that the NaN row never sees (after it) stay finite.
  for (int where = 0; where < 4; ++where) {
    INFO("NaN in " << (where == 0 ? "k" : where == 1 ? "v" : where == 2 ? "q" : "dout"));
    dense_case c(2, 150, 16, true, 31);
    std::vector<float>* target[] = {&c.k, &c.v, &c.q, &c.dout};
    (*target[where])[static_cast<std::size_t>(70 * c.D + 3)] =
        std::numeric_limits<float>::quiet_NaN();
    c.forward();
    std::vector<float> dq, dk, dv;
    std::vector<double> rq, rk, rv;
    c.backward(alibi::backend::eigen{2}, dq, dk, dv, nullptr, true);
    c.backward(alibi::backend::reference{}, rq, rk, rv, nullptr, true);
    for (auto [got, want] : {std::pair{&dq, &rq}, std::pair{&dk, &rk}, std::pair{&dv, &rv}}) {
      index_t nan_mismatch = 0, nans = 0;
      double err = 0;
      for (std::size_t e = 0; e < got->size(); ++e) {
        const bool gn = std::isnan((*got)[e]), wn = std::isnan((*want)[e]);
        nans += wn;
        if (gn != wn) ++nan_mismatch;
        if (!gn && !wn) err = std::max(err, std::abs((*got)[e] - (*want)[e]));
      }
      // dV = P^T dO does not involve V: a NaN in V reaches dQ and dK only.
      if (!(where == 1 && got == &dv)) CHECK(nans > 0);
      CHECK(nan_mismatch == 0);
      CHECK(err < 1e-4);
    }
  }
}

TEST_CASE("backward: every bad argument is an alibi::error naming it", "[backward][validation]") {
  dense_case c(2, 8, 4, false, 41);
  std::vector<float> dq(c.q.size()), dk(c.q.size()), dv(c.q.size()), ds(2), small(4);
  auto v = [&](std::vector<float>& x) { return c.view(x); };
  auto expect = [&](const std::string& what, auto&& call) {
    INFO(what);
    try {
      call();
      FAIL("no error");
    } catch (const alibi::error& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(what));
    }
  };
  const alibi::backend::eigen be{1};
  auto lse = alibi::tensor_view<const float, 3>(c.p.logsumexp);
  expect("dq must have q's shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse,
                  alibi::make_view(dq.data(), 1, 2, 7, 4), v(dk), v(dv), c.p);
  });
  expect("dk must have k's shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq),
                  alibi::make_view(dk.data(), 1, 1, 8, 4), v(dv), c.p);
  });
  expect("dv must have v's shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk),
                  alibi::make_view(dv.data(), 1, 2, 8, 3), c.p);
  });
  expect("dout must have out's shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), alibi::make_view(c.dout.data(), 2, 2, 4, 4),
                  lse, v(dq), v(dk), v(dv), c.p);
  });
  expect("params.logsumexp must have shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout),
                  alibi::make_view<const float>(c.lse.data(), 1, 2, 7), v(dq), v(dk), v(dv), c.p);
  });
  expect("dslopes must have shape", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(dv), c.p,
                  alibi::make_view(ds.data(), 1, 3));
  });
  expect("dslopes was given but params.slopes is disabled", [&] {
    alibi::attention_params p = c.p;
    p.slopes = alibi::slope_config::none();
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(dv), p,
                  alibi::make_view(ds.data(), 1, 2));
  });
  expect("dq.stride(3) (head_dim) must be 1", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse,
                  alibi::make_strided_view<float, 4>(dq.data(), {1, 2, 8, 4}, {64, 32, 1, 8}),
                  v(dk), v(dv), c.p);
  });
  expect("dk's elements must not overlap", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq),
                  alibi::make_strided_view<float, 4>(dk.data(), {1, 2, 8, 4}, {64, 0, 4, 1}), v(dv),
                  c.p);
  });
  expect("dq and q share memory", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(c.q), v(dk), v(dv), c.p);
  });
  expect("dk and dv share memory", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(dk), c.p);
  });
  expect("dv and dout share memory", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(c.dout),
                  c.p);
  });
  expect("the gradients must be float", [&] {
    std::vector<double> d1(c.q.size()), d2(c.q.size()), d3(c.q.size());
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse,
                  alibi::make_view(d1.data(), 1, 2, 8, 4), alibi::make_view(d2.data(), 1, 2, 8, 4),
                  alibi::make_view(d3.data(), 1, 2, 8, 4), c.p);
  });
  std::vector<float> g_lse(16);
  expect(
      "dlogsumexp must have the logsumexp's shape (batch, q_heads, q_len) = (1, 2, 8), but "
      "extent(2) is 7",
      [&] {
        backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(dv),
                      c.p, {}, alibi::make_view<const float>(g_lse.data(), 1, 2, 7));
      });
  expect("dq and dlogsumexp share memory", [&] {
    backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq), v(dk), v(dv), c.p,
                  {}, alibi::make_view<const float>(dq.data() + 8, 1, 2, 8));
  });
  CHECK(can_implement_backward_with(be, v(c.q), v(c.k), v(c.v), v(c.out), v(c.dout), lse, v(dq),
                                    v(dk), v(dv), c.p));
  (void)small;
}

TEST_CASE("backward: fully masked rows, keys past lengths and padded rows get zero gradients",
          "[backward][edge]") {
  // Key mask excluding every key of entry 1; entry 0 with a window that leaves the first
  // rows without keys (q_len > k_len, bottom-right aligned, window_right 0, window_left 0).
  case_spec s;
  s.batch = 2;
  s.hq = 2;
  s.hkv = 1;
  s.lq = 9;
  s.lk = 5;
  s.d = 8;
  s.key_mask = true;
  s.lengths = true;
  s.window_left = 0;
  s.window_right = 0;
  // Seed 4 also passes a gradient of the logsumexp: rows without keys ignore it.
  for (std::uint64_t seed : {3, 4}) {
    s.seed = seed;
    INFO("seed " << seed);
    backward_case bc(s);
    grads g(s, 1234.5f);
    bc.run(alibi::backend::eigen{2}, g);
    const backward_oracle o = make_oracle(bc);
    check_against_oracle(bc, o, g);
    // Entry 1 has every key masked: all its gradients are exactly 0.
    for (index_t h = 0; h < s.hq; ++h)
      for (index_t i = 0; i < s.lq; ++i)
        for (index_t d = 0; d < s.d; ++d) CHECK(g.dq.view(1, h, i, d) == 0.0f);
    for (index_t j = 0; j < s.lk; ++j)
      for (index_t d = 0; d < s.d; ++d) {
        CHECK(g.dk.view(1, 0, j, d) == 0.0f);
        CHECK(g.dv.view(1, 0, j, d) == 0.0f);
      }
  }
}

TEST_CASE("backward: split keys (few heads, long keys) equal the reference", "[backward][split]") {
  // One kv head and 2 batch entries: the keys are split into chunks whose dQ accumulators
  // are added in chunk order.
  case_spec s;
  s.batch = 1;
  s.hq = 2;
  s.hkv = 1;
  s.lq = 40;
  s.lk = 2600;
  s.d = 16;
  s.causal = true;
  s.seed = 4;
  run_grid({s}, true);
}

TEST_CASE("backward: empty shapes write zeros and never crash", "[backward][edge]") {
  // (B, Hq, Hkv, Lq, Lk, D): no keys, no queries, no heads, head_dim 0, no batch (also with
  // enough keys to split: the split's count once divided by the number of (batch, KV head)
  // pairs).
  const index_t shapes[][6] = {{2, 2, 1, 5, 0, 4}, {2, 2, 1, 0, 5, 4}, {2, 0, 0, 5, 5, 4},
                               {1, 2, 2, 3, 3, 0}, {0, 2, 2, 3, 3, 4}, {0, 2, 2, 3, 2048, 4}};
  for (const auto& s : shapes) {
    const index_t B = s[0], Hq = s[1], Hkv = s[2], Lq = s[3], Lk = s[4], D = s[5];
    INFO("B " << B << " Hq " << Hq << " Hkv " << Hkv << " Lq " << Lq << " Lk " << Lk << " D " << D);
    const auto nq = static_cast<std::size_t>(B * Hq * Lq * D),
               nk = static_cast<std::size_t>(B * Hkv * Lk * D);
    std::vector<float> q(nq, 0.5f), k(nk, 0.25f), v(nk, 1.0f), out(nq, 0.0f), dout(nq, 1.0f),
        lse(static_cast<std::size_t>(B * Hq * Lq), 0.0f);
    for (int backend = 0; backend < 2; ++backend) {
      std::vector<float> dq(nq, 7.0f), dk(nk, 7.0f), dv(nk, 7.0f),
          ds(static_cast<std::size_t>(Hq), 7.0f);
      alibi::attention_params p;
      p.logsumexp = alibi::make_view(lse.data(), B, Hq, Lq);
      auto qv = alibi::make_view(q.data(), B, Hq, Lq, D);
      auto kv = alibi::make_view(k.data(), B, Hkv, Lk, D);
      auto vv = alibi::make_view(v.data(), B, Hkv, Lk, D);
      auto ov = alibi::make_view(out.data(), B, Hq, Lq, D);
      alibi::attention(alibi::backend::eigen{2}, qv, kv, vv, ov, p);
      auto run = [&](const auto& be) {
        backward_with(
            be, qv, kv, vv, ov, alibi::make_view(dout.data(), B, Hq, Lq, D), p.logsumexp,
            alibi::make_view(dq.data(), B, Hq, Lq, D), alibi::make_view(dk.data(), B, Hkv, Lk, D),
            alibi::make_view(dv.data(), B, Hkv, Lk, D), p, alibi::make_view(ds.data(), 1, Hq));
      };
      if (backend == 0)
        run(alibi::backend::eigen{2});
      else
        run(alibi::backend::reference{});
      // Without keys or queries every gradient is 0; with D = 0 there are none but dslopes.
      for (float x : dq) CHECK(x == 0.0f);
      for (float x : dk) CHECK(x == 0.0f);
      for (float x : dv) CHECK(x == 0.0f);
      for (float x : ds) CHECK(x == 0.0f);
    }
  }
}

TEST_CASE("backward: the gradients by name, the logsumexp through params",
          "[backward][validation]") {
  // The forward writes params.logsumexp; the backward reads it from the same params.
  const index_t B = 1, H = 2, L = 8, D = 4;
  std::vector<float> q(B * H * L * D), k(q.size()), v(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> randn;
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = randn(rng);
  std::vector<float> out(q.size()), dout(q.size(), 0.5f), lse(B * H * L);
  std::vector<float> dq(q.size()), dk(q.size()), dv(q.size());
  const auto qv = alibi::make_view<const float>(q.data(), B, H, L, D);
  const auto kv = alibi::make_view<const float>(k.data(), B, H, L, D);
  const auto vv = alibi::make_view<const float>(v.data(), B, H, L, D);
  const auto ov = alibi::make_view<const float>(out.data(), B, H, L, D);
  const auto dov = alibi::make_view<const float>(dout.data(), B, H, L, D);
  alibi::attention_params params;
  params.mask.causal = true;
  alibi::attention_gradients<float> grads;
  grads.dq = alibi::make_view(dq.data(), B, H, L, D);
  grads.dk = alibi::make_view(dk.data(), B, H, L, D);
  grads.dv = alibi::make_view(dv.data(), B, H, L, D);
  // Without the forward's logsumexp the call says where it comes from.
  REQUIRE_THROWS_WITH(
      alibi::attention_backward(alibi::backend::eigen{}, qv, kv, vv, ov, dov, params, grads),
      Catch::Contains("params.logsumexp") &&
          Catch::Contains("run the forward with params.logsumexp set"));
  params.logsumexp = alibi::make_view(lse.data(), B, H, L);
  alibi::attention(alibi::backend::eigen{}, qv, kv, vv, alibi::make_view(out.data(), B, H, L, D),
                   params);
  alibi::attention_backward(alibi::backend::eigen{}, qv, kv, vv, ov, dov, params, grads);
  // The same call through the reference backend, in double.
  std::vector<double> rq(q.size()), rk(q.size()), rv(q.size());
  alibi::attention_gradients<double> ref;
  ref.dq = alibi::make_view(rq.data(), B, H, L, D);
  ref.dk = alibi::make_view(rk.data(), B, H, L, D);
  ref.dv = alibi::make_view(rv.data(), B, H, L, D);
  alibi::attention_backward(alibi::backend::reference{}, qv, kv, vv, ov, dov, params, ref);
  for (std::size_t i = 0; i < q.size(); ++i) {
    CHECK(std::fabs(dq[i] - rq[i]) < 1e-5);
    CHECK(std::fabs(dk[i] - rk[i]) < 1e-5);
    CHECK(std::fabs(dv[i] - rv[i]) < 1e-5);
  }
  REQUIRE(
      alibi::can_implement_backward(alibi::backend::eigen{}, qv, kv, vv, ov, dov, params, grads));
}

namespace {

/// Gradients of one (1, H, Lq, D) non-causal problem whose queries sit at q_offset and keys
/// at 0 (every key before every query), by `be`; the forward is the eigen one.
template <class Backend, class TG>
void far_query_gradients(const Backend& be, index_t q_offset, const std::vector<float>& slopes,
                         index_t lq, index_t lk, std::vector<TG>& dq, std::vector<TG>& dk,
                         std::vector<TG>& dv, std::vector<float>& ds) {
  const index_t H = static_cast<index_t>(slopes.size()), D = 16;
  std::mt19937 rng(11);
  std::normal_distribution<float> randn;
  std::vector<float> q(static_cast<std::size_t>(H * lq * D)),
      k(static_cast<std::size_t>(H * lk * D));
  std::vector<float> v(k.size()), dout(q.size()), out(q.size()),
      lse(static_cast<std::size_t>(H * lq));
  for (auto* x : {&q, &k, &v, &dout})
    for (float& e : *x) e = randn(rng);
  const std::vector<index_t> qo = {q_offset}, ko = {0};
  alibi::attention_params params;
  params.q_offsets = alibi::make_view(qo.data(), 1);
  params.k_offsets = alibi::make_view(ko.data(), 1);
  params.slopes.values = alibi::make_view(slopes.data(), 1, H);
  params.logsumexp = alibi::make_view(lse.data(), 1, H, lq);
  const auto qv = alibi::make_view<const float>(q.data(), 1, H, lq, D);
  const auto kv = alibi::make_view<const float>(k.data(), 1, H, lk, D);
  const auto vv = alibi::make_view<const float>(v.data(), 1, H, lk, D);
  alibi::attention(alibi::backend::eigen{2}, qv, kv, vv, alibi::make_view(out.data(), 1, H, lq, D),
                   params);
  dq.assign(q.size(), TG(0));
  dk.assign(k.size(), TG(0));
  dv.assign(v.size(), TG(0));
  ds.assign(static_cast<std::size_t>(H), 0.0f);
  alibi::attention_gradients<TG> g;
  g.dq = alibi::make_view(dq.data(), 1, H, lq, D);
  g.dk = alibi::make_view(dk.data(), 1, H, lk, D);
  g.dv = alibi::make_view(dv.data(), 1, H, lk, D);
  g.dslopes = alibi::make_view(ds.data(), 1, H);
  alibi::attention_backward(be, qv, kv, vv, alibi::make_view<const float>(out.data(), 1, H, lq, D),
                            alibi::make_view<const float>(dout.data(), 1, H, lq, D), params, g);
}

/// Each gradient within 1e-5 of the double oracle's, relative to its scale (its largest
/// magnitude, at least 1), and each d(slope) within 1e-5 relative.
void check_near_oracle(const std::vector<float>& dq, const std::vector<float>& dk,
                       const std::vector<float>& dv, const std::vector<float>& ds,
                       const std::vector<double>& rq, const std::vector<double>& rk,
                       const std::vector<double>& rv, const std::vector<float>& ds_ref) {
  auto max_err = [](const std::vector<float>& got, const std::vector<double>& want) {
    double e = 0, scale = 1;
    for (std::size_t i = 0; i < want.size(); ++i) {
      e = std::max(e, std::abs(got[i] - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    return e / scale;
  };
  CHECK(max_err(dq, rq) < 1e-5);
  CHECK(max_err(dk, rk) < 1e-5);
  CHECK(max_err(dv, rv) < 1e-5);
  for (std::size_t h = 0; h < ds.size(); ++h)
    CHECK(std::abs(ds[h] - ds_ref[h]) < 1e-5 * std::max(1.0f, std::abs(ds_ref[h])));
}

}  // namespace

TEST_CASE("backward: rows whose every key is far keep fp32 precision", "[backward][eigen]") {
  // Moving queries further from keys that all lie before them adds one constant to each
  // row's scores: no gradient changes (nor d(slopes): a row's dS sums to zero). A backward
  // that rebuilt P from these rows' fp32 logsumexp (about -0.5 x 1e6, ulp 0.03) would be
  // off by several percent; the shifted frame gives the near rows' bits.
  const std::vector<float> slopes = {0.5f, 0.0625f};
  const index_t L = 64;
  std::vector<float> nq, nk, nv, nds, fq, fk, fv, fds, ds_ref;
  far_query_gradients(alibi::backend::eigen{2}, L + 100, slopes, L, L, nq, nk, nv, nds);
  far_query_gradients(alibi::backend::eigen{2}, L + 1000000, slopes, L, L, fq, fk, fv, fds);
  CHECK(nq == fq);
  CHECK(nk == fk);
  CHECK(nv == fv);
  CHECK(nds == fds);
  std::vector<double> rq, rk, rv;
  far_query_gradients(alibi::backend::reference{}, L + 1000000, slopes, L, L, rq, rk, rv, ds_ref);
  check_near_oracle(fq, fk, fv, fds, rq, rk, rv, ds_ref);
}

TEST_CASE("backward: d(slopes) of rows with one far key is zero", "[backward][eigen]") {
  // One key per row: P = 1 whatever the slope, so d(slope) is exactly 0. Weighting each dS by
  // the full distance (up to 512) would multiply the fp32 residue of dP - D by it.
  const std::vector<float> slopes = {1.0f};
  std::vector<float> dq, dk, dv, ds;
  far_query_gradients(alibi::backend::eigen{2}, 1, slopes, 512, 1, dq, dk, dv, ds);
  CHECK(ds[0] == 0.0f);
}

TEST_CASE("negative slopes: rows dominated by their farthest keys keep fp32 precision",
          "[backward][eigen]") {
  // A negative slope makes the bias grow with distance: the farthest keys hold each row's
  // maximum, about |slope| x k_len above the nearest. Shifted by the nearest key, those
  // scores (~1500 here) kept 2^-13 of absolute precision and the output was off by up to
  // 3e-4; shifted by the farthest key they are small again.
  const index_t Lq = 4, Lk = 3000, D = 64;
  const std::vector<float> slopes = {-0.5f, -0.25f};
  const index_t H = static_cast<index_t>(slopes.size());
  std::mt19937 rng(5);
  std::normal_distribution<float> randn;
  std::vector<float> q(static_cast<std::size_t>(H * Lq * D)),
      k(static_cast<std::size_t>(H * Lk * D));
  std::vector<float> v(k.size()), out(q.size());
  std::vector<double> ref(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = randn(rng);
  alibi::attention_params p;
  p.slopes.values = alibi::make_view(slopes.data(), 1, H);
  const auto qv = alibi::make_view<const float>(q.data(), 1, H, Lq, D);
  const auto kv = alibi::make_view<const float>(k.data(), 1, H, Lk, D);
  const auto vv = alibi::make_view<const float>(v.data(), 1, H, Lk, D);
  alibi::attention(alibi::backend::eigen{2}, qv, kv, vv, alibi::make_view(out.data(), 1, H, Lq, D),
                   p);
  alibi::attention(alibi::backend::reference{}, qv, kv, vv,
                   alibi::make_view(ref.data(), 1, H, Lq, D), p);
  double err = 0;
  for (std::size_t i = 0; i < out.size(); ++i) err = std::max(err, std::abs(out[i] - ref[i]));
  CHECK(err < 5e-6);

  // The backward, queries after all their keys: the same rows from the gradients' side.
  std::vector<float> dq, dk, dv, ds, ds_ref;
  std::vector<double> rq, rk, rv;
  far_query_gradients(alibi::backend::eigen{2}, Lk - 8, slopes, 8, Lk, dq, dk, dv, ds);
  far_query_gradients(alibi::backend::reference{}, Lk - 8, slopes, 8, Lk, rq, rk, rv, ds_ref);
  check_near_oracle(dq, dk, dv, ds, rq, rk, rv, ds_ref);
}
