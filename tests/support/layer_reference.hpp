// SPDX-License-Identifier: MIT
// The layer tests' oracle: a plain, loop-by-loop computation of multi-head attention and of
// the Transformer layer, templated on the scalar type (double = the reference, float = the
// naive computation whose error sets the tolerance, as for the attention grid). Written from
// the definitions (seed 001's modules, PyTorch nn.Linear / nn.LayerNorm / nn.GELU), sharing
// nothing with the library but the slope formula.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <alibi/layers.hpp>
#include <alibi/core/slopes.hpp>

namespace alibi_test {

using alibi::index_t;

struct named_tensor {
  std::vector<index_t> shape;
  std::vector<float> data;
};
using weight_map = std::map<std::string, named_tensor>;

/// n values from N(0, 1) with a fixed seed.
inline std::vector<float> randn(index_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

/// Random parameters for a module: weights N(0, 1/in) (unit-scale outputs), biases
/// N(0, 0.1), LayerNorm gains 1 + N(0, 0.1).
template <class Module>
weight_map random_weights(const Module& m, unsigned seed) {
  std::mt19937 rng(seed);
  weight_map w;
  for (const alibi::parameter_info& p : m.parameters()) {
    named_tensor t{p.shape, {}};
    index_t n = 1;
    for (index_t e : p.shape) n *= e;
    const bool gain =
        p.name.find("norm") != std::string::npos && p.name.find(".weight") != std::string::npos;
    const double sd = p.shape.size() == 2 ? 1.0 / std::sqrt(static_cast<double>(p.shape[1])) : 0.1;
    std::normal_distribution<double> dist(0.0, sd);
    for (index_t i = 0; i < n; ++i)
      t.data.push_back(static_cast<float>((gain ? 1.0 : 0.0) + dist(rng)));
    w[p.name] = t;
  }
  return w;
}

template <class Module>
void set_all(Module& m, const weight_map& w, const std::string& prefix = "") {
  for (const auto& kv : w)
    if (kv.first.rfind(prefix, 0) == 0)
      m.set(kv.first.substr(prefix.size()), kv.second.data.data(), kv.second.shape);
}

/// Which keys each query may use, host side (the reference's view of forward_options).
struct mask_args {
  bool causal = false;
  index_t window_left = -1, window_right = -1;
  std::vector<index_t> q_len, k_len;  // empty: full
  std::vector<bool> key_pad;          // (batch, k_len) true = padding; empty: none
};

/// Rounds a value stored between steps; the identity for the reference and the fp32 naive
/// computation, rounding to half/bfloat16 for the CUDA tests' naive computation in that type.
struct no_rounding {
  template <class R>
  R operator()(R x) const {
    return x;
  }
};

/// Leaves the projected keys and values as they are.
struct no_kv_hook {
  template <class V>
  void operator()(V&, V&) const {}
};

template <class R, class Round = no_rounding>
std::vector<R> linear_ref(const std::vector<R>& x, index_t rows, index_t in, const named_tensor& w,
                          const named_tensor* b, Round round = {}) {
  const index_t out = w.shape[0];
  std::vector<R> y(static_cast<std::size_t>(rows * out));
  for (index_t r = 0; r < rows; ++r)
    for (index_t o = 0; o < out; ++o) {
      R acc = b ? static_cast<R>(b->data[static_cast<std::size_t>(o)]) : R(0);
      for (index_t i = 0; i < in; ++i)
        acc += x[static_cast<std::size_t>(r * in + i)] *
               static_cast<R>(w.data[static_cast<std::size_t>(o * in + i)]);
      y[static_cast<std::size_t>(r * out + o)] = round(acc);
    }
  return y;
}

inline const named_tensor* optional(const weight_map& w, const std::string& name) {
  const auto it = w.find(name);
  return it == w.end() ? nullptr : &it->second;
}

/// Multi-head attention of dense (batch, len, features) inputs -> (batch, q_len, embed_dim);
/// rows past q_len(b) are 0. Positions: bottom-right (query i at k_len(b) - q_len(b) + i).
/// `kv_hook(k, v)` may change the projected keys and values ((B * Lk, kv_heads * head_dim)
/// each), e.g. to the values a half-precision KV cache holds.
template <class R, class Round = no_rounding, class KvHook = no_kv_hook>
std::vector<R> mha_ref(const alibi::mha_config& c, const weight_map& w, const std::string& pre,
                       const std::vector<R>& query, const std::vector<R>& key,
                       const std::vector<R>& value, index_t B, index_t Lq, index_t Lk,
                       const mask_args& m, Round round = {}, KvHook kv_hook = {}) {
  const index_t E = c.embed_dim, D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads;
  const index_t nq = Hq * D, nkv = Hkv * D;
  const auto q = linear_ref(query, B * Lq, E, w.at(pre + "q_proj.weight"),
                            optional(w, pre + "q_proj.bias"), round);
  auto k = linear_ref(key, B * Lk, c.key_dim, w.at(pre + "k_proj.weight"),
                      optional(w, pre + "k_proj.bias"), round);
  auto v = linear_ref(value, B * Lk, c.value_dim, w.at(pre + "v_proj.weight"),
                      optional(w, pre + "v_proj.bias"), round);
  kv_hook(k, v);
  const R scale = c.scale ? static_cast<R>(*c.scale) : R(1) / std::sqrt(static_cast<R>(D));
  std::vector<R> ctx(static_cast<std::size_t>(B * Lq * nq), R(0));
  for (index_t b = 0; b < B; ++b) {
    const index_t lq = m.q_len.empty() ? Lq : m.q_len[static_cast<std::size_t>(b)];
    const index_t lk = m.k_len.empty() ? Lk : m.k_len[static_cast<std::size_t>(b)];
    for (index_t h = 0; h < Hq; ++h) {
      const index_t g = h / (Hq / Hkv);
      const R slope =
          static_cast<R>(alibi::slope(h, Hq, c.slopes.max_bias)) * static_cast<R>(c.slopes.scale);
      for (index_t i = 0; i < lq; ++i) {
        const index_t qp = lk - lq + i;
        std::vector<R> s;
        std::vector<index_t> keys;
        for (index_t j = 0; j < lk; ++j) {
          if (m.causal && j > qp) continue;
          if (m.window_left >= 0 && qp - j > m.window_left) continue;
          if (m.window_right >= 0 && j - qp > m.window_right) continue;
          if (!m.key_pad.empty() && m.key_pad[static_cast<std::size_t>(b * Lk + j)]) continue;
          R dot = 0;
          for (index_t d = 0; d < D; ++d)
            dot += q[static_cast<std::size_t>((b * Lq + i) * nq + h * D + d)] *
                   k[static_cast<std::size_t>((b * Lk + j) * nkv + g * D + d)];
          s.push_back(scale * dot - slope * static_cast<R>(std::llabs(qp - j)));
          keys.push_back(j);
        }
        if (s.empty()) continue;
        const R mx = *std::max_element(s.begin(), s.end());
        R sum = 0;
        for (R& x : s) sum += (x = std::exp(x - mx));
        for (std::size_t t = 0; t < s.size(); ++t)
          for (index_t d = 0; d < D; ++d)
            ctx[static_cast<std::size_t>((b * Lq + i) * nq + h * D + d)] +=
                round(s[t] / sum) *
                v[static_cast<std::size_t>((b * Lk + keys[t]) * nkv + g * D + d)];
      }
    }
  }
  for (R& t : ctx) t = round(t);
  auto out = linear_ref(ctx, B * Lq, nq, w.at(pre + "out_proj.weight"),
                        optional(w, pre + "out_proj.bias"), round);
  for (index_t b = 0; b < B; ++b)
    for (index_t i = m.q_len.empty() ? Lq : m.q_len[static_cast<std::size_t>(b)]; i < Lq; ++i)
      std::fill_n(out.begin() + (b * Lq + i) * E, E, R(0));
  return out;
}

/// nn.LayerNorm (b may be null: no bias) or, with rms, RMSNorm: x / sqrt(mean(x^2) + eps) g.
template <class R, class Round = no_rounding>
void norm_ref(std::vector<R>& x, index_t rows, index_t n, const named_tensor& g,
              const named_tensor* b, R eps, bool rms = false, Round round = {}) {
  for (index_t r = 0; r < rows; ++r) {
    R* p = x.data() + r * n;
    R mean = 0, var = 0;
    if (!rms) {
      for (index_t i = 0; i < n; ++i) mean += p[i];
      mean /= static_cast<R>(n);
    }
    for (index_t i = 0; i < n; ++i) var += (p[i] - mean) * (p[i] - mean);
    var /= static_cast<R>(n);
    for (index_t i = 0; i < n; ++i)
      p[i] = round((p[i] - mean) / std::sqrt(var + eps) *
                       static_cast<R>(g.data[static_cast<std::size_t>(i)]) +
                   (b ? static_cast<R>(b->data[static_cast<std::size_t>(i)]) : R(0)));
  }
}

/// The activations of PyTorch: nn.GELU(), nn.GELU(approximate='tanh'), nn.SiLU().
template <class R>
R activation_ref(alibi::activation act, R t) {
  switch (act) {
    case alibi::activation::gelu:
      return R(0.5) * t * (R(1) + std::erf(t / std::sqrt(R(2))));
    case alibi::activation::gelu_tanh:
      return R(0.5) * t *
             (R(1) + std::tanh(std::sqrt(R(2) / R(3.14159265358979323846)) *
                               (t + R(0.044715) * t * t * t)));
    case alibi::activation::silu:
      return t / (R(1) + std::exp(-t));
  }
  return t;
}

/// The Transformer layer of seed 001 (post-norm) or its pre-norm variant, with LayerNorm or
/// RMSNorm and a plain or gated (down(act(gate y) * up y)) FFN; padded rows 0.
template <class R, class Round = no_rounding, class KvHook = no_kv_hook>
std::vector<R> layer_ref(const alibi::layer_config& c, const weight_map& w, const std::vector<R>& x,
                         index_t B, index_t L, const mask_args& m, Round round = {},
                         KvHook kv_hook = {}) {
  const index_t E = c.attention.embed_dim, rows = B * L;
  const R eps = static_cast<R>(c.norm_eps);
  const bool rms = c.norm_kind == alibi::norm_type::rms_norm;
  auto layer_norm_ref = [&](std::vector<R>& v, const char* which) {
    const std::string n = which;
    norm_ref(v, rows, E, w.at(n + ".weight"), optional(w, n + ".bias"), eps, rms, round);
  };
  auto ffn = [&](const std::vector<R>& y) {
    auto h = linear_ref(y, rows, E, w.at("ffn.0.weight"), optional(w, "ffn.0.bias"), round);
    if (c.ffn == alibi::ffn_type::gated) {
      const auto g =
          linear_ref(y, rows, E, w.at("ffn.gate.weight"), optional(w, "ffn.gate.bias"), round);
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = round(round(activation_ref(c.act, g[i])) * h[i]);
    } else {
      for (R& t : h) t = round(activation_ref(c.act, t));
    }
    return linear_ref(h, rows, c.ff_dim, w.at("ffn.2.weight"), optional(w, "ffn.2.bias"), round);
  };
  std::vector<R> out = x;
  if (c.norm == alibi::norm_position::post) {
    const auto a = mha_ref(c.attention, w, "self_attn.", x, x, x, B, L, L, m, round, kv_hook);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = round(out[i] + a[i]);
    layer_norm_ref(out, "norm1");
    const auto f = ffn(out);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = round(out[i] + f[i]);
    layer_norm_ref(out, "norm2");
  } else {
    std::vector<R> n = x;
    layer_norm_ref(n, "norm1");
    const auto a = mha_ref(c.attention, w, "self_attn.", n, n, n, B, L, L, m, round, kv_hook);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = round(out[i] + a[i]);
    n = out;
    layer_norm_ref(n, "norm2");
    const auto f = ffn(n);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = round(out[i] + f[i]);
  }
  for (index_t b = 0; b < B; ++b)
    for (index_t i = m.q_len.empty() ? L : m.q_len[static_cast<std::size_t>(b)]; i < L; ++i)
      std::fill_n(out.begin() + (b * L + i) * E, E, R(0));
  return out;
}

template <class R>
std::vector<R> cast_vector(const std::vector<float>& v) {
  return std::vector<R>(v.begin(), v.end());
}

/// The tolerance rule of the attention grid: max |impl - ref64| <= 2 max |naive32 - ref64|
/// plus a floor of 8 fp32 ulps of the largest reference value.
struct layer_check {
  double err = 0, naive_err = 0, scale = 0;
  bool nan = false;
  double bound() const { return 2 * naive_err + 8 * 0x1p-24 * std::max(1.0, scale); }
  bool ok() const { return !nan && err <= bound(); }
};

inline layer_check check_rows(const std::vector<float>& impl, const std::vector<double>& ref,
                              const std::vector<float>& naive) {
  layer_check c;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(impl[i])) c.nan = true;
    c.err = std::max(c.err, std::fabs(impl[i] - ref[i]));
    c.naive_err = std::max(c.naive_err, std::fabs(naive[i] - ref[i]));
    c.scale = std::max(c.scale, std::fabs(ref[i]));
  }
  return c;
}

}  // namespace alibi_test
