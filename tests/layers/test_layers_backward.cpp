// SPDX-License-Identifier: MIT
// The layers' backward pass (multi_head_attention and transformer_layer: forward_train +
// backward): every gradient against central finite differences of the forward in double
// precision (reference backend), the Eigen backend (fp32) against the reference, thread-count
// independence, errors, and a few steps of gradient descent that reduce a loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/backend/eigen/attention_backward.hpp>
#include <alibi/backend/reference/attention_backward.hpp>

#include "layer_reference.hpp"

namespace {

using alibi::index_t;
using namespace alibi_test;
using cpu = alibi::backend::eigen;
using ref = alibi::backend::reference;

/// Parameters rounded to multiples of 2^-10: a finite-difference step of 2^-13 then moves a
/// parameter exactly (set() takes floats), so the difference quotient sees the step it is
/// divided by.
template <class Module>
weight_map quantized_weights(const Module& m, unsigned seed) {
  weight_map w = random_weights(m, seed);
  for (auto& kv : w)
    for (float& x : kv.second.data) x = std::ldexp(std::round(std::ldexp(x, 10)), -10);
  return w;
}

/// Masks, lengths and key padding of a test call, with the storage its views point to.
struct call_options {
  bool causal = false;
  index_t window_left = -1, window_right = -1;
  std::vector<index_t> q_len, k_len;  // empty: full
  std::vector<char> key_pad;          // (batch, k_len), 1 = padding; empty: none
  std::unique_ptr<bool[]> pad_store;
  index_t B = 0, Lk = 0;

  alibi::forward_options make() {
    alibi::forward_options o;
    o.mask.causal = causal;
    o.mask.window_left = window_left;
    o.mask.window_right = window_right;
    if (!q_len.empty()) o.q_lengths = alibi::make_view<const index_t>(q_len.data(), B);
    if (!k_len.empty()) o.k_lengths = alibi::make_view<const index_t>(k_len.data(), B);
    if (!key_pad.empty()) {
      pad_store.reset(new bool[key_pad.size()]);
      for (std::size_t i = 0; i < key_pad.size(); ++i) pad_store[i] = key_pad[i] != 0;
      o.key_padding_mask = alibi::make_view<const bool>(pad_store.get(), B, Lk);
    }
    return o;
  }
  index_t qn(index_t b, index_t L) const {
    return q_len.empty() ? L : q_len[static_cast<std::size_t>(b)];
  }
  index_t kn(index_t b, index_t L) const {
    return k_len.empty() ? L : k_len[static_cast<std::size_t>(b)];
  }
};

/// (B, L, F) values: N(0, 1), and NaN in rows at or past `used(b)` (nothing may read them).
template <class R>
std::vector<R> input_rows(index_t B, index_t L, index_t F, unsigned seed,
                          const std::vector<index_t>& used = {}) {
  const std::vector<float> v = randn(B * L * F, seed);
  std::vector<R> out(v.begin(), v.end());
  for (index_t b = 0; b < B; ++b)
    for (index_t i = used.empty() ? L : used[static_cast<std::size_t>(b)]; i < L; ++i)
      std::fill_n(out.begin() + (b * L + i) * F, F, std::numeric_limits<R>::quiet_NaN());
  return out;
}

std::vector<index_t> max_lengths(const call_options& c, index_t B, index_t L) {
  std::vector<index_t> n;
  for (index_t b = 0; b < B; ++b) n.push_back(std::max(c.qn(b, L), c.kn(b, L)));
  return n;
}

/// sum over valid rows (i < q_len(b)) of dy . out: the loss whose gradient is dy.
double dot_loss(const std::vector<double>& dy, const std::vector<double>& out, index_t B, index_t L,
                index_t E, const call_options& c) {
  double s = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < c.qn(b, L); ++i)
      for (index_t e = 0; e < E; ++e) {
        const std::size_t k = static_cast<std::size_t>((b * L + i) * E + e);
        s += dy[k] * out[k];
      }
  return s;
}

/// One gradient's finite-difference check: max |analytic - fd| and max |fd|.
struct fd_result {
  std::string name;
  double err = 0, scale = 0;
};

constexpr double fd_step = 0x1p-13;

// The CPU backends have the backward layer operations (a backend without them, CUDA, stops
// forward_train / backward with one static_assert).
static_assert(alibi::detail::has_layer_backward<cpu>::value &&
                  alibi::detail::has_layer_backward<ref>::value,
              "CPU layer_ops must provide the backward operations");

/// Central differences of loss() for every element of every parameter in `grads`.
template <class Module, class Loss>
void fd_parameters(Module& m, Loss loss, const alibi::parameter_gradients<double>& grads,
                   std::vector<fd_result>& results) {
  for (const auto& e : grads) {
    std::vector<float> w = m.get(e.name);
    REQUIRE(w.size() == e.values.size());
    fd_result r{e.name};
    for (std::size_t i = 0; i < w.size(); ++i) {
      const float w0 = w[i];
      w[i] = static_cast<float>(w0 + fd_step);
      REQUIRE(static_cast<double>(w[i]) - w0 == fd_step);  // the step is exact
      m.set(e.name, w.data(), e.shape);
      const double lp = loss();
      w[i] = static_cast<float>(w0 - fd_step);
      m.set(e.name, w.data(), e.shape);
      const double lm = loss();
      w[i] = w0;
      const double fd = (lp - lm) / (2 * fd_step);
      r.err = std::max(r.err, std::fabs(e.values[i] - fd));
      r.scale = std::max(r.scale, std::fabs(fd));
    }
    m.set(e.name, w.data(), e.shape);
    results.push_back(r);
  }
}

/// Central differences with respect to an input's finite elements; NaN elements (padding)
/// must have an exactly zero analytic gradient.
template <class Loss>
void fd_input(const std::string& name, std::vector<double>& x, const std::vector<double>& analytic,
              Loss loss, std::vector<fd_result>& results) {
  fd_result r{name};
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      INFO(name << "[" << i << "] is padding");
      REQUIRE(analytic[i] == 0.0);
      continue;
    }
    const double x0 = x[i];
    x[i] = x0 + fd_step;
    const double lp = loss();
    x[i] = x0 - fd_step;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * fd_step);
    r.err = std::max(r.err, std::fabs(analytic[i] - fd));
    r.scale = std::max(r.scale, std::fabs(fd));
  }
  results.push_back(r);
}

/// Relative errors below 1e-6. The reference is each gradient's own largest finite
/// difference, except for gradients that vanish identically (k_proj.bias: adding a constant
/// to every key adds q . b_k to a whole softmax row, which the softmax ignores): their
/// difference quotients are rounding noise, so they are compared with 1% of the largest
/// gradient of the call.
void require_fd_close(const std::vector<fd_result>& results) {
  double overall = 0;
  for (const fd_result& r : results) overall = std::max(overall, r.scale);
  REQUIRE(overall > 0);
  for (const fd_result& r : results) {
    const double rel = r.err / std::max(r.scale, 1e-2 * overall);
    INFO(r.name << ": max |analytic - fd| = " << r.err << ", max |fd| = " << r.scale
                << ", relative " << rel);
    CHECK(rel < 1e-6);
  }
}

template <class R>
alibi::tensor_view<const R, 3> cview(const std::vector<R>& v, index_t B, index_t L, index_t F) {
  return alibi::make_view<const R>(v.data(), B, L, F);
}
template <class R>
alibi::tensor_view<R, 3> mview(std::vector<R>& v, index_t B, index_t L, index_t F) {
  return alibi::make_view(v.data(), B, L, F);
}

alibi::mha_config mha(index_t E, index_t Hq, index_t Hkv, bool bias) {
  alibi::mha_config c;
  c.embed_dim = E;
  c.q_heads = Hq;
  c.kv_heads = Hkv;
  c.bias = bias;
  return c;
}

/// Checks padded rows of a (B, L, F) gradient are exactly 0 (rows at or past used(b)).
void require_zero_rows(const std::vector<double>& g, index_t B, index_t L, index_t F,
                       const std::vector<index_t>& used) {
  for (index_t b = 0; b < B; ++b)
    for (index_t i = used[static_cast<std::size_t>(b)]; i < L; ++i)
      for (index_t e = 0; e < F; ++e)
        REQUIRE(g[static_cast<std::size_t>((b * L + i) * F + e)] == 0.0);
}

}  // namespace

TEST_CASE("multi_head_attention backward matches finite differences (double, reference)",
          "[layers-backward]") {
  struct self_case {
    const char* name;
    alibi::mha_config cfg;
    bool causal;
    std::vector<index_t> len;
    bool key_pad;
    index_t window = -1;  // window_left = window_right = window
  };
  const std::vector<self_case> cases = {
      {"4 heads, causal, bias", mha(16, 4, 0, true), true, {}, false},
      {"GQA 4/2, causal, lengths {6, 3}", mha(16, 4, 2, true), true, {6, 3}, false},
      {"3 heads, no bias, bidirectional, key padding mask", mha(12, 3, 0, false), false, {}, true},
      {"MQA 4/1, lengths {2, 6} and key padding mask", mha(16, 4, 1, true), false, {2, 6}, true},
      {"4 heads, sliding window (2, 2)", mha(16, 4, 0, true), false, {}, false, 2},
  };
  for (const self_case& tc : cases) SECTION(std::string("self-attention, ") + tc.name) {
      alibi::multi_head_attention<double, ref> m(tc.cfg);
      set_all(m, quantized_weights(m, 21));
      const index_t B = 2, L = 6, E = tc.cfg.embed_dim;
      call_options c;
      c.B = B;
      c.Lk = L;
      c.causal = tc.causal;
      c.window_left = c.window_right = tc.window;
      c.q_len = c.k_len = tc.len;
      if (tc.key_pad) c.key_pad = {0, 1, 0, 0, 1, 0, /* batch 1 */ 1, 0, 0, 1, 0, 0};
      const alibi::forward_options opt = c.make();
      std::vector<double> x = input_rows<double>(B, L, E, 3, max_lengths(c, B, L));
      std::vector<double> dy = input_rows<double>(B, L, E, 4, c.q_len);  // NaN: never read
      std::vector<double> dy0 = dy;
      for (double& v : dy0) v = std::isnan(v) ? 0.0 : v;
      std::vector<double> out(x.size()), dx(x.size());
      decltype(m)::activations saved;
      m.forward_train(cview(x, B, L, E), mview(out, B, L, E), saved, opt);
      // The training forward computes the forward.
      std::vector<double> plain(x.size());
      m.forward(cview(x, B, L, E), mview(plain, B, L, E), opt);
      REQUIRE(plain == out);
      alibi::parameter_gradients<double> g;
      m.backward(cview(dy, B, L, E), saved, mview(dx, B, L, E), g);
      REQUIRE(g.size() == m.parameters().size());
      std::size_t i = 0;
      for (const alibi::parameter_info& p : m.parameters()) {
        REQUIRE(g.begin()[static_cast<std::ptrdiff_t>(i)].name == p.name);
        REQUIRE(g.at(p.name).shape == p.shape);
        ++i;
      }
      require_zero_rows(dx, B, L, E, max_lengths(c, B, L));
      auto loss = [&] {
        std::vector<double> o(x.size());
        m.forward(cview(x, B, L, E), mview(o, B, L, E), opt);
        return dot_loss(dy0, o, B, L, E, c);
      };
      std::vector<fd_result> results;
      fd_parameters(m, loss, g, results);
      fd_input("dx", x, dx, loss, results);
      require_fd_close(results);
    }

  SECTION("cross-attention, GQA 4/2, key_dim 12, value_dim 20, k_lengths, key padding mask") {
    alibi::mha_config cfg = mha(16, 4, 2, true);
    cfg.key_dim = 12;
    cfg.value_dim = 20;
    alibi::multi_head_attention<double, ref> m(cfg);
    set_all(m, quantized_weights(m, 5));
    const index_t B = 2, Lq = 4, Lk = 7, E = 16;
    call_options c;
    c.B = B;
    c.Lk = Lk;
    c.q_len = {4, 3};
    c.k_len = {7, 5};
    c.key_pad = {0, 0, 1, 0, 0, 1, 0, /* batch 1 */ 0, 1, 0, 0, 0, 0, 0};
    const alibi::forward_options opt = c.make();
    std::vector<double> q = input_rows<double>(B, Lq, E, 6, c.q_len);
    std::vector<double> k = input_rows<double>(B, Lk, 12, 7, c.k_len);
    std::vector<double> v = input_rows<double>(B, Lk, 20, 8, c.k_len);
    std::vector<double> dy = input_rows<double>(B, Lq, E, 9, c.q_len);
    std::vector<double> dy0 = dy;
    for (double& t : dy0) t = std::isnan(t) ? 0.0 : t;
    std::vector<double> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
    decltype(m)::activations saved;
    m.forward_train(cview(q, B, Lq, E), cview(k, B, Lk, 12), cview(v, B, Lk, 20),
                    mview(out, B, Lq, E), saved, opt);
    alibi::parameter_gradients<double> g;
    m.backward(cview(dy, B, Lq, E), saved, mview(dq, B, Lq, E), mview(dk, B, Lk, 12),
               mview(dv, B, Lk, 20), g);
    require_zero_rows(dq, B, Lq, E, c.q_len);
    require_zero_rows(dk, B, Lk, 12, c.k_len);
    require_zero_rows(dv, B, Lk, 20, c.k_len);
    // Keys excluded by the key padding mask get no gradient.
    for (index_t r = 0; r < B * Lk; ++r)
      if (c.key_pad[static_cast<std::size_t>(r)])
        for (index_t e = 0; e < 12; ++e) REQUIRE(dk[static_cast<std::size_t>(r * 12 + e)] == 0.0);
    auto loss = [&] {
      std::vector<double> o(q.size());
      m.forward(cview(q, B, Lq, E), cview(k, B, Lk, 12), cview(v, B, Lk, 20), mview(o, B, Lq, E),
                opt);
      return dot_loss(dy0, o, B, Lq, E, c);
    };
    std::vector<fd_result> results;
    fd_parameters(m, loss, g, results);
    fd_input("dquery", q, dq, loss, results);
    fd_input("dkey", k, dk, loss, results);
    fd_input("dvalue", v, dv, loss, results);
    require_fd_close(results);
  }
}

namespace {

/// Finite differences of a transformer_layer<double, reference> of `lc` (its attention, ff_dim
/// and ffn_bias set here from the variant): 0 = 4 heads, bidirectional; 1 = GQA 4/2, causal,
/// lengths {6, 4}, a key padding mask.
void check_layer_fd(alibi::layer_config lc, int variant) {
  lc.attention = mha(16, 4, variant ? 2 : 0, true);
  lc.ff_dim = 24;
  lc.ffn_bias = variant == 0;
  alibi::transformer_layer<double, ref> layer(lc);
  set_all(layer, quantized_weights(layer, 31 + static_cast<unsigned>(variant)));
  const index_t B = 2, L = 6, E = 16;
  call_options c;
  c.B = B;
  c.Lk = L;
  if (variant) {
    c.causal = true;
    c.q_len = c.k_len = {6, 4};
    c.key_pad = {0, 0, 1, 0, 0, 0, /* batch 1 */ 1, 0, 0, 0, 0, 0};
  }
  const alibi::forward_options opt = c.make();
  std::vector<double> x = input_rows<double>(B, L, E, 13, max_lengths(c, B, L));
  std::vector<double> dy = input_rows<double>(B, L, E, 14, c.q_len);
  std::vector<double> dy0 = dy;
  for (double& t : dy0) t = std::isnan(t) ? 0.0 : t;
  std::vector<double> out(x.size()), dx(x.size());
  decltype(layer)::activations saved;
  layer.forward_train(cview(x, B, L, E), mview(out, B, L, E), saved, opt);
  alibi::parameter_gradients<double> g;
  layer.backward(cview(dy, B, L, E), saved, mview(dx, B, L, E), g);
  REQUIRE(g.size() == layer.parameters().size());
  require_zero_rows(dx, B, L, E, max_lengths(c, B, L));
  auto loss = [&] {
    std::vector<double> o(x.size());
    layer.forward(cview(x, B, L, E), mview(o, B, L, E), opt);
    return dot_loss(dy0, o, B, L, E, c);
  };
  std::vector<fd_result> results;
  fd_parameters(layer, loss, g, results);
  fd_input("dx", x, dx, loss, results);
  require_fd_close(results);
}

}  // namespace

TEST_CASE("transformer_layer backward matches finite differences (double, reference)",
          "[layers-backward]") {
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre})
    for (auto act : {alibi::activation::gelu, alibi::activation::gelu_tanh})
      for (int variant : {0, 1})
        DYNAMIC_SECTION((norm == alibi::norm_position::post ? "post-norm" : "pre-norm")
                        << (act == alibi::activation::gelu ? ", gelu" : ", gelu_tanh")
                        << (variant ? ", GQA 4/2, causal, lengths {6, 4}, key padding mask"
                                    : ", 4 heads, bidirectional")) {
          alibi::layer_config lc;
          lc.norm = norm;
          lc.act = act;
          check_layer_fd(lc, variant);
        }
}

namespace {

/// The model families' layer options: RMSNorm, the gated FFN, SiLU, LayerNorm without bias.
std::vector<std::pair<std::string, alibi::layer_config>> family_variants() {
  std::vector<std::pair<std::string, alibi::layer_config>> out;
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre}) {
    const std::string where = norm == alibi::norm_position::post ? "post-norm" : "pre-norm";
    alibi::layer_config c;
    c.norm = norm;
    c.norm_kind = alibi::norm_type::rms_norm;
    c.ffn = alibi::ffn_type::gated;
    c.act = alibi::activation::silu;
    out.push_back({where + ", RMSNorm, gated SiLU (Baichuan)", c});
    c = {};
    c.norm = norm;
    c.norm_bias = false;
    out.push_back({where + ", LayerNorm without bias, gelu (MPT)", c});
    c = {};
    c.norm = norm;
    c.act = alibi::activation::silu;
    out.push_back({where + ", plain FFN, SiLU", c});
    c = {};
    c.norm = norm;
    c.ffn = alibi::ffn_type::gated;
    c.act = alibi::activation::gelu_tanh;
    out.push_back({where + ", LayerNorm, gated gelu_tanh", c});
  }
  return out;
}

}  // namespace

TEST_CASE("transformer_layer backward of the family options matches finite differences",
          "[layers-backward]") {
  for (const auto& [name, lc] : family_variants())
    for (int variant : {0, 1})
      DYNAMIC_SECTION(name << (variant ? ", GQA, causal, padding" : ", bidirectional")) {
        check_layer_fd(lc, variant);
      }
}

namespace {

/// Gradients of one layer call in both precisions, compared per tensor.
struct layer_run {
  std::vector<float> out, dx;
  alibi::parameter_gradients<float> grads;
};

/// Runs forward_train + backward of a transformer_layer<float, Backend> on row-strided
/// inputs (row stride E + 3, NaN in the gaps and the padded rows) and returns dense results.
template <class Backend>
layer_run run_layer(const alibi::layer_config& lc, const weight_map& w, const Backend& be,
                    const std::vector<float>& x_dense, const std::vector<float>& dy_dense,
                    index_t B, index_t L, call_options& c) {
  alibi::transformer_layer<float, Backend> layer(lc, be);
  set_all(layer, w);
  const index_t E = lc.attention.embed_dim, ld = E + 3;
  const float nan_f = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(static_cast<std::size_t>(B * L * ld), nan_f), dy(x.size(), nan_f);
  const std::vector<index_t> used = max_lengths(c, B, L);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < L; ++i) {
      if (i < used[static_cast<std::size_t>(b)])
        std::copy_n(x_dense.begin() + (b * L + i) * E, E, x.begin() + (b * L + i) * ld);
      if (i < c.qn(b, L))
        std::copy_n(dy_dense.begin() + (b * L + i) * E, E, dy.begin() + (b * L + i) * ld);
    }
  auto view = [&](std::vector<float>& v) {
    return alibi::make_strided_view<float, 3>(v.data(), {B, L, E}, {L * ld, ld, 1});
  };
  std::vector<float> out(x.size(), 7.0f), dx(x.size(), 7.0f);
  typename alibi::transformer_layer<float, Backend>::activations saved;
  const alibi::forward_options opt = c.make();
  layer.forward_train(view(x), view(out), saved, opt);
  layer_run r;
  layer.backward(view(dy), saved, view(dx), r.grads);
  for (index_t row = 0; row < B * L; ++row) {
    for (index_t e = E; e < ld; ++e) {  // guard elements between rows are never written
      REQUIRE(out[static_cast<std::size_t>(row * ld + e)] == 7.0f);
      REQUIRE(dx[static_cast<std::size_t>(row * ld + e)] == 7.0f);
    }
    r.out.insert(r.out.end(), out.begin() + row * ld, out.begin() + row * ld + E);
    r.dx.insert(r.dx.end(), dx.begin() + row * ld, dx.begin() + row * ld + E);
  }
  return r;
}

}  // namespace

TEST_CASE("transformer_layer backward: eigen (fp32) matches the reference (double)",
          "[layers-backward]") {
  std::vector<std::pair<std::string, alibi::layer_config>> configs = family_variants();
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre})
    for (auto act : {alibi::activation::gelu, alibi::activation::gelu_tanh}) {
      alibi::layer_config c;
      c.norm = norm;
      c.act = act;
      configs.push_back(
          {std::string(norm == alibi::norm_position::post ? "post-norm" : "pre-norm") +
               (act == alibi::activation::gelu ? ", gelu" : ", gelu_tanh"),
           c});
    }
  for (const auto& [name, config] : configs) DYNAMIC_SECTION(name) {
      alibi::layer_config lc = config;
      lc.attention = mha(64, 8, 2, true);
      lc.ff_dim = 96;
      alibi::transformer_layer<double, ref> probe(lc);
      const weight_map w = random_weights(probe, 41);
      const index_t B = 3, L = 37, E = 64;
      call_options c;
      c.B = B;
      c.Lk = L;
      c.causal = true;
      c.q_len = c.k_len = {37, 20, 1};
      const auto x = randn(B * L * E, 42);
      const auto dy = randn(B * L * E, 43);
      const layer_run fast = run_layer(lc, w, cpu{2}, x, dy, B, L, c);

      // The oracle: the same layer in double (reference backend: double GEMMs, the
      // double-precision attention backward).
      alibi::transformer_layer<double, ref> layer(lc);
      set_all(layer, w);
      std::vector<double> xd(x.begin(), x.end()), dyd(dy.begin(), dy.end());
      std::vector<double> out(xd.size()), dx(xd.size());
      decltype(layer)::activations saved;
      layer.forward_train(cview(xd, B, L, E), mview(out, B, L, E), saved, c.make());
      alibi::parameter_gradients<double> g;
      layer.backward(cview(dyd, B, L, E), saved, mview(dx, B, L, E), g);

      // Tolerance. fp32 rounds each operation with u = 2^-24 = 6e-8; a gradient here is a
      // chain of about 8 stages (LayerNorm, two FFN GEMMs, the activation, LayerNorm, the
      // output projection, the attention backward, the input projections), each a sum of
      // at most n = max(rows, ff_dim) = 111 terms. Rounding errors of independent terms
      // add like a random walk: about stages x sqrt(n) x u = 5e-6 relative to the
      // magnitude of the terms (the worst case, stages x n x u = 5e-5, needs every
      // rounding in the same direction). Gradients summed over rows (dW, db) can be
      // smaller than their terms, so the error is measured relative to the largest
      // gradient of the same kind in the call (weight matrices; vectors; dx). 2e-5 is 4x
      // the random-walk estimate (measured: below 5e-7); a wrong formula is off by O(1).
      auto compare = [](const std::string& name, const std::vector<float>& got,
                        const std::vector<double>& want, double scale) {
        double err = 0;
        bool nan = false;
        for (std::size_t i = 0; i < want.size(); ++i) {
          nan = nan || std::isnan(got[i]);
          err = std::max(err, std::fabs(got[i] - want[i]));
        }
        INFO(name << ": max |eigen - reference| = " << err << ", scale " << scale << ", relative "
                  << err / scale);
        REQUIRE_FALSE(nan);
        CHECK(err <= 2e-5 * scale);
      };
      double weight_scale = 0, vector_scale = 0, dx_scale = 0;
      for (const auto& e : g)
        for (double v : e.values)
          (e.shape.size() == 2 ? weight_scale : vector_scale) =
              std::max(e.shape.size() == 2 ? weight_scale : vector_scale, std::fabs(v));
      for (double v : dx) dx_scale = std::max(dx_scale, std::fabs(v));
      for (const auto& e : g)
        compare(e.name, fast.grads[e.name], e.values,
                e.shape.size() == 2 ? weight_scale : vector_scale);
      compare("dx", fast.dx, dx, dx_scale);
    }
}

TEST_CASE("layers backward: results do not depend on the thread count (bitwise)",
          "[layers-backward]") {
  alibi::layer_config lc;
  lc.attention = mha(64, 8, 4, true);
  lc.ff_dim = 600;  // more than one 512-column GEMM block, several 64-column sum blocks
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre})
    SECTION(norm == alibi::norm_position::post ? "post-norm" : "pre-norm") {
      lc.norm = norm;
      alibi::transformer_layer<double, ref> probe(lc);
      const weight_map w = random_weights(probe, 51);
      const index_t B = 2, L = 150, E = 64;  // 300 rows: more than one 256-row block
      call_options c;
      c.B = B;
      c.Lk = L;
      c.causal = true;
      c.q_len = c.k_len = {150, 131};
      const auto x = randn(B * L * E, 52);
      const auto dy = randn(B * L * E, 53);
      std::vector<layer_run> runs;
      for (int threads : {1, 2, 3}) runs.push_back(run_layer(lc, w, cpu{threads}, x, dy, B, L, c));
      for (int t : {1, 2}) {
        REQUIRE(runs[0].out == runs[static_cast<std::size_t>(t)].out);
        REQUIRE(runs[0].dx == runs[static_cast<std::size_t>(t)].dx);
        for (const auto& e : runs[0].grads) {
          INFO(e.name << ", " << t + 1 << " threads");
          REQUIRE(e.values == runs[static_cast<std::size_t>(t)].grads[e.name]);
        }
      }
    }
}

TEST_CASE(
    "multi_head_attention backward: eigen matches the reference, cross-attention, "
    "1/2/3 threads bitwise",
    "[layers-backward]") {
  alibi::mha_config cfg = mha(32, 4, 2, true);
  cfg.key_dim = 24;
  cfg.value_dim = 40;
  const index_t B = 2, Lq = 19, Lk = 60;
  call_options c;
  c.B = B;
  c.Lk = Lk;
  c.q_len = {7, 19};
  c.k_len = {60, 31};
  alibi::multi_head_attention<double, ref> oracle(cfg);
  const weight_map w = random_weights(oracle, 61);
  set_all(oracle, w);
  const auto q = randn(B * Lq * 32, 62), k = randn(B * Lk * 24, 63), v = randn(B * Lk * 40, 64);
  const auto dy = randn(B * Lq * 32, 65);
  struct result {
    std::vector<float> dq, dk, dv;
    alibi::parameter_gradients<float> g;
  };
  std::vector<result> runs;
  for (int threads : {1, 2, 3}) {
    alibi::multi_head_attention<float, cpu> m(cfg, cpu{threads});
    set_all(m, w);
    result r{std::vector<float>(q.size()),
             std::vector<float>(k.size()),
             std::vector<float>(v.size()),
             {}};
    std::vector<float> out(q.size());
    decltype(m)::activations saved;
    m.forward_train(cview(q, B, Lq, 32), cview(k, B, Lk, 24), cview(v, B, Lk, 40),
                    mview(out, B, Lq, 32), saved, c.make());
    m.backward(cview(dy, B, Lq, 32), saved, mview(r.dq, B, Lq, 32), mview(r.dk, B, Lk, 24),
               mview(r.dv, B, Lk, 40), r.g);
    runs.push_back(std::move(r));
  }
  for (std::size_t t : {1u, 2u}) {
    REQUIRE(runs[0].dq == runs[t].dq);
    REQUIRE(runs[0].dk == runs[t].dk);
    REQUIRE(runs[0].dv == runs[t].dv);
    for (const auto& e : runs[0].g) REQUIRE(e.values == runs[t].g[e.name]);
  }
  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
      dyd(dy.begin(), dy.end());
  std::vector<double> out(qd.size()), dq(qd.size()), dk(kd.size()), dv(vd.size());
  decltype(oracle)::activations saved;
  oracle.forward_train(cview(qd, B, Lq, 32), cview(kd, B, Lk, 24), cview(vd, B, Lk, 40),
                       mview(out, B, Lq, 32), saved, c.make());
  alibi::parameter_gradients<double> g;
  oracle.backward(cview(dyd, B, Lq, 32), saved, mview(dq, B, Lq, 32), mview(dk, B, Lk, 24),
                  mview(dv, B, Lk, 40), g);
  // Tolerance as in the layer test: 2e-5 of the largest gradient of the same kind (fewer
  // stages, fp32 sums of at most 120 terms).
  auto within = [](const std::vector<float>& got, const std::vector<double>& want, double scale) {
    double err = 0;
    for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
    return err <= 2e-5 * scale;
  };
  auto max_abs = [](const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
  };
  CHECK(within(runs[0].dq, dq, max_abs(dq)));
  CHECK(within(runs[0].dk, dk, max_abs(dk)));
  CHECK(within(runs[0].dv, dv, max_abs(dv)));
  double weight_scale = 0, bias_scale = 0;
  for (const auto& e : g)
    (e.shape.size() == 2 ? weight_scale : bias_scale) =
        std::max(e.shape.size() == 2 ? weight_scale : bias_scale, max_abs(e.values));
  for (const auto& e : g) {
    INFO(e.name);
    CHECK(within(runs[0].g[e.name], e.values, e.shape.size() == 2 ? weight_scale : bias_scale));
  }
}

TEST_CASE("layers backward: refused calls name the problem", "[layers-backward]") {
  alibi::layer_config lc;
  lc.attention = mha(16, 4, 0, true);
  lc.ff_dim = 32;
  alibi::transformer_layer<float, cpu> layer(lc), other(lc);
  const index_t B = 2, L = 5, E = 16;
  const auto x = randn(B * L * E, 1);
  std::vector<float> out(x.size()), dx(x.size());
  decltype(layer)::activations saved;
  alibi::parameter_gradients<float> g;
  using Catch::Matchers::Contains;
  REQUIRE(saved.empty());
  REQUIRE_THROWS_WITH(layer.backward(cview(x, B, L, E), saved, mview(dx, B, L, E), g),
                      Contains("saved") && Contains("forward_train"));
  layer.forward_train(cview(x, B, L, E), mview(out, B, L, E), saved);
  REQUIRE_FALSE(saved.empty());
  REQUIRE_THROWS_WITH(other.backward(cview(x, B, L, E), saved, mview(dx, B, L, E), g),
                      Contains("another layer"));
  REQUIRE_THROWS_WITH(layer.backward(cview(x, B, L - 1, E), saved, mview(dx, B, L, E), g),
                      Contains("dy must have shape (2, 5, 16)"));
  alibi::multi_head_attention<float, cpu> m(lc.attention);
  alibi::parameter_gradients<float> wrong(m.parameters());
  REQUIRE_THROWS_WITH(layer.backward(cview(x, B, L, E), saved, mview(dx, B, L, E), wrong),
                      Contains("grads"));
  REQUIRE_THROWS_WITH(g["no_such.weight"], Contains("no gradient named 'no_such.weight'"));
  // Shapes built by hand: a negative extent or a wrapped size is an alibi::error.
  for (const std::vector<index_t>& shape :
       {std::vector<index_t>{-2, 4}, std::vector<index_t>{index_t(1) << 40, index_t(1) << 40}})
    REQUIRE_THROWS_WITH(
        alibi::parameter_gradients<float>(std::vector<alibi::parameter_info>{{"w", shape}}),
        Contains("parameter 'w'"));
  // Self- vs cross-attention activations.
  decltype(m)::activations ms;
  m.forward_train(cview(x, B, L, E), cview(x, B, L, E), cview(x, B, L, E), mview(out, B, L, E), ms);
  alibi::parameter_gradients<float> mg;
  REQUIRE_THROWS_WITH(m.backward(cview(x, B, L, E), ms, mview(dx, B, L, E), mg),
                      Contains("cross-attention forward_train"));
  // Cross-attention: dquery's padded rows are zeroed last, so it may not share dkey's or
  // dvalue's memory.
  std::vector<float> dkv(x.size());
  REQUIRE_THROWS_WITH(m.backward(cview(x, B, L, E), ms, mview(dkv, B, L, E), mview(dkv, B, L, E),
                                 mview(dx, B, L, E), mg),
                      Contains("dquery and dkey share memory"));
  REQUIRE_THROWS_WITH(m.backward(cview(x, B, L, E), ms, mview(dx, B, L, E), mview(dkv, B, L, E),
                                 mview(dx, B, L, E), mg),
                      Contains("dquery and dvalue share memory"));
  // A tensor-parallel shard's forward-only setting has no training path.
  alibi::multi_head_attention<float, cpu> shard(lc.attention);
  shard.set_output_bias(false);
  decltype(m)::activations ss;
  REQUIRE_THROWS_WITH(shard.forward_train(cview(x, B, L, E), mview(out, B, L, E), ss),
                      Contains("the output bias is off"));
  // dx may be dy.
  std::vector<float> dy = x, dx2(x.size());
  layer.backward(cview(dy, B, L, E), saved, mview(dx2, B, L, E), g);
  layer.backward(cview(dy, B, L, E), saved, mview(dy, B, L, E), g);
  REQUIRE(dy == dx2);
}

TEST_CASE("layers backward: gradient descent on one layer reduces a loss", "[layers-backward]") {
  // A post-norm layer (seed 001's) fitted to a random target by plain gradient descent on
  // the mean squared error; 20 steps must remove at least 30% of the loss.
  alibi::layer_config lc;
  lc.attention = mha(32, 4, 2, true);
  lc.ff_dim = 64;
  alibi::transformer_layer<float, cpu> layer(lc, cpu{2});
  set_all(layer, random_weights(layer, 71));
  const index_t B = 2, L = 16, E = 32, n = B * L * E;
  const auto x = randn(n, 72);
  const auto target = randn(n, 73);
  alibi::forward_options opt;
  opt.mask.causal = true;
  std::vector<float> out(static_cast<std::size_t>(n)), dy(out.size()), dx(out.size());
  decltype(layer)::activations saved;
  alibi::parameter_gradients<float> g;
  std::vector<double> losses;
  const float lr = 0.5f;
  for (int step = 0; step <= 20; ++step) {
    layer.forward_train(cview(x, B, L, E), mview(out, B, L, E), saved, opt);
    double loss = 0;
    for (index_t i = 0; i < n; ++i) {
      const double d = out[static_cast<std::size_t>(i)] - target[static_cast<std::size_t>(i)];
      loss += d * d / static_cast<double>(n);
      dy[static_cast<std::size_t>(i)] = static_cast<float>(2 * d / static_cast<double>(n));
    }
    losses.push_back(loss);
    if (step == 20) break;
    layer.backward(cview(dy, B, L, E), saved, mview(dx, B, L, E), g);
    for (const auto& e : g) {
      std::vector<float> p = layer.get(e.name);
      for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * e.values[i];
      layer.set(e.name, p.data(), e.shape);
    }
  }
  INFO("loss: initial " << losses.front() << ", after 20 steps " << losses.back());
  for (std::size_t s = 1; s < losses.size(); ++s) CHECK(losses[s] < losses[s - 1]);
  REQUIRE(losses.back() < 0.7 * losses.front());
}

TEST_CASE("layers backward: padded rows that are also masked keys stay out of the gradients",
          "[layers-backward]") {
  // Row 2 and 3 of the one sequence are padded queries (q_len 2) and excluded keys: no output
  // reads them, so NaN there must not reach any parameter gradient (as 0 x NaN).
  const index_t B = 1, L = 4, E = 16;
  std::vector<float> x = randn(B * L * E, 5);
  for (index_t i = 2 * E; i < L * E; ++i) x[static_cast<std::size_t>(i)] = std::nanf("");
  const std::vector<index_t> q_len = {2};
  const bool pad[] = {false, false, true, true};
  alibi::forward_options opt;
  opt.mask.causal = true;
  opt.q_lengths = alibi::make_view(q_len.data(), B);
  opt.key_padding_mask = alibi::make_view(pad, B, L);
  std::vector<float> dy = randn(B * L * E, 6), out(x.size()), dx(x.size());
  auto all_finite = [](const alibi::parameter_gradients<float>& g) {
    for (const auto& e : g)
      for (float v : e.values)
        if (!std::isfinite(v)) return false;
    return true;
  };
  alibi::multi_head_attention<float, cpu> m(mha(E, 4, 2, true));
  decltype(m)::activations ms;
  m.forward_train(cview(x, B, L, E), mview(out, B, L, E), ms, opt);
  alibi::parameter_gradients<float> mg;
  m.backward(cview(dy, B, L, E), ms, mview(dx, B, L, E), mg);
  CHECK(all_finite(mg));
  alibi::layer_config lc;
  lc.attention = mha(E, 4, 2, true);
  lc.ff_dim = 32;
  alibi::transformer_layer<float, cpu> layer(lc);
  decltype(layer)::activations ls;
  layer.forward_train(cview(x, B, L, E), mview(out, B, L, E), ls, opt);
  alibi::parameter_gradients<float> lg;
  layer.backward(cview(dy, B, L, E), ls, mview(dx, B, L, E), lg);
  CHECK(all_finite(lg));
  for (index_t i = 0; i < 2 * E; ++i) CHECK(std::isfinite(dx[static_cast<std::size_t>(i)]));
}

TEST_CASE("activation backward stays finite where the activation saturates", "[layers-backward]") {
  // Pre-activations whose forward is finite (x itself or 0 for the GELUs, x or 0 for SiLU):
  // the derivative must be too (gelu_tanh once formed 0 x inf = NaN for |x| > 1e19).
  using ops = alibi::detail::layer_ops<cpu>;
  const float x[] = {1e30f, -1e30f, 3e38f, -3e38f, 1e19f, 40.0f, -1e4f, 0.0f};
  const float want[] = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.5f};
  for (auto act :
       {alibi::activation::gelu, alibi::activation::gelu_tanh, alibi::activation::silu}) {
    std::vector<float> dh(8, 1.0f);
    ops::activation_backward(cpu{1}, x, 8, dh.data(), 8, 1, 8, act);
    for (int i = 0; i < 8; ++i) {
      INFO("activation " << static_cast<int>(act) << ", x = " << x[i]);
      CHECK(dh[static_cast<std::size_t>(i)] == want[i]);
    }
  }
}
