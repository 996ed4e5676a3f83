// SPDX-License-Identifier: MIT
// The layers on the CPU: multi_head_attention, transformer_layer and kv_cache against the
// plain double-precision computation of tests/support/layer_reference.hpp; decode == prefill;
// thread-count independence; parameters and safetensors; errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/models/checkpoint.hpp>

#include "call_fixture.hpp"
#include "layer_reference.hpp"

namespace {

using alibi::index_t;
using namespace alibi_test;
using cpu = alibi::backend::eigen;

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float sentinel = 12345.0f;

/// A (batch, len, features) input with row stride features + 3: the gaps and the rows past
/// each sequence's length hold NaN, so reading them shows up in the output.
struct padded_rows {
  index_t B, L, F, ld;
  std::vector<float> mem;
  padded_rows(const std::vector<float>& dense, index_t B_, index_t L_, index_t F_,
              const std::vector<index_t>& len = {})
      : B(B_), L(L_), F(F_), ld(F_ + 3), mem(static_cast<std::size_t>(B_ * L_ * (F_ + 3)), nan_f) {
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < (len.empty() ? L : len[static_cast<std::size_t>(b)]); ++i)
        std::copy_n(dense.begin() + (b * L + i) * F, F, mem.begin() + (b * L + i) * ld);
  }
  alibi::tensor_view<const float, 3> view() const {
    return alibi::make_strided_view<const float, 3>(mem.data(), {B, L, F}, {L * ld, ld, 1});
  }
};

/// An output with row stride features + 5 whose gaps must keep a sentinel (guard elements).
struct guarded_out {
  index_t B, L, F, ld;
  std::vector<float> mem;
  guarded_out(index_t B_, index_t L_, index_t F_)
      : B(B_),
        L(L_),
        F(F_),
        ld(F_ + 5),
        mem(static_cast<std::size_t>(B_ * L_ * (F_ + 5)), sentinel) {}
  alibi::tensor_view<float, 3> view() {
    return alibi::make_strided_view<float, 3>(mem.data(), {B, L, F}, {L * ld, ld, 1});
  }
  std::vector<float> dense() const {
    std::vector<float> d;
    for (index_t r = 0; r < B * L; ++r)
      d.insert(d.end(), mem.begin() + r * ld, mem.begin() + r * ld + F);
    return d;
  }
  bool guards_intact() const {
    for (index_t r = 0; r < B * L; ++r)
      for (index_t c = F; c < ld; ++c)
        if (mem[static_cast<std::size_t>(r * ld + c)] != sentinel) return false;
    return true;
  }
};

alibi::forward_options options_for(const mask_args& m, std::vector<index_t>& q_store,
                                   std::vector<index_t>& k_store) {
  alibi::forward_options o;
  o.mask.causal = m.causal;
  o.mask.window_left = m.window_left;
  o.mask.window_right = m.window_right;
  q_store = m.q_len;
  k_store = m.k_len;
  if (!q_store.empty())
    o.q_lengths = alibi::make_view<const index_t>(q_store.data(), index_t(q_store.size()));
  if (!k_store.empty())
    o.k_lengths = alibi::make_view<const index_t>(k_store.data(), index_t(k_store.size()));
  return o;
}

void require_close(const std::vector<float>& impl, const std::vector<double>& ref,
                   const std::vector<float>& naive) {
  const layer_check c = check_rows(impl, ref, naive);
  INFO("max |impl - ref64| = " << c.err << ", bound " << c.bound() << " (naive fp32 error "
                               << c.naive_err << ", max |ref| " << c.scale << ")");
  REQUIRE_FALSE(c.nan);
  REQUIRE(c.ok());
}

struct mha_case {
  const char* name;
  alibi::mha_config cfg;
  index_t B, Lq, Lk;
  bool cross;
  mask_args mask;
  bool key_pad = false;
};

std::vector<mha_case> mha_cases() {
  std::vector<mha_case> cases;
  auto cfg = [](index_t E, index_t Hq, index_t Hkv, index_t D, bool bias) {
    alibi::mha_config c;
    c.embed_dim = E;
    c.q_heads = Hq;
    c.kv_heads = Hkv;
    c.head_dim = D;
    c.bias = bias;
    return c;
  };
  cases.push_back({"self, 3 heads, bidirectional", cfg(48, 3, 0, 0, true), 2, 37, 37, false, {}});
  mask_args causal;
  causal.causal = true;
  cases.push_back({"self, 8 heads, causal", cfg(64, 8, 0, 0, true), 2, 70, 70, false, causal});
  cases.push_back({"self, GQA 8/2, head_dim 32 != embed/heads, no bias", cfg(64, 8, 2, 32, false),
                   2, 33, 33, false, causal});
  cases.push_back({"self, MQA 5/1", cfg(40, 5, 1, 0, true), 1, 50, 50, false, causal});
  mask_args pad = causal;
  pad.q_len = {29, 0, 41};
  pad.k_len = {29, 0, 41};
  cases.push_back({"self, causal, padding as lengths (incl. 0)", cfg(48, 6, 3, 0, true), 3, 41, 41,
                   false, pad});
  mask_args window;
  window.window_left = 5;
  window.window_right = 2;
  cases.push_back(
      {"self, sliding window (5, 2)", cfg(32, 4, 0, 0, true), 2, 30, 30, false, window});
  alibi::mha_config cross = cfg(48, 4, 2, 16, true);
  cross.key_dim = 24;
  cross.value_dim = 40;
  mask_args cl;
  cl.q_len = {7, 19};
  cl.k_len = {60, 3};
  cases.push_back(
      {"cross, key_dim 24, value_dim 40, q_len != k_len, lengths", cross, 2, 19, 60, true, cl});
  mha_case kp{"cross, key_padding_mask (seed 000)", cfg(32, 4, 0, 0, true), 2, 23, 31, true, {}};
  kp.key_pad = true;
  cases.push_back(kp);
  return cases;
}

}  // namespace

TEST_CASE("multi_head_attention matches the double-precision reference", "[layers]") {
  for (mha_case tc : mha_cases()) {
    SECTION(tc.name) {
      alibi::multi_head_attention<float, cpu> m(tc.cfg, cpu{2});
      const alibi::mha_config& c = m.config();
      const weight_map w = random_weights(m, 7);
      set_all(m, w);
      const index_t Lk = tc.cross ? tc.Lk : tc.Lq;
      const auto q = randn(tc.B * tc.Lq * c.embed_dim, 1);
      const auto k = tc.cross ? randn(tc.B * Lk * c.key_dim, 2) : q;
      const auto v = tc.cross ? randn(tc.B * Lk * c.value_dim, 3) : q;
      if (tc.key_pad) {
        std::mt19937 rng(4);
        for (index_t i = 0; i < tc.B * Lk; ++i) tc.mask.key_pad.push_back(rng() % 3 == 0);
        for (index_t j = 0; j < Lk; ++j)
          tc.mask.key_pad[static_cast<std::size_t>(Lk + j)] = true;  // batch 1: all padding
      }
      const padded_rows qp(q, tc.B, tc.Lq, c.embed_dim, tc.mask.q_len);
      const padded_rows kp(k, tc.B, Lk, c.key_dim, tc.mask.k_len);
      const padded_rows vp(v, tc.B, Lk, c.value_dim, tc.mask.k_len);
      guarded_out out(tc.B, tc.Lq, c.embed_dim);
      std::vector<index_t> qs, ks;
      alibi::forward_options opt = options_for(tc.mask, qs, ks);
      std::vector<char> pad_store(tc.mask.key_pad.begin(), tc.mask.key_pad.end());
      if (tc.key_pad)
        opt.key_padding_mask =
            alibi::make_view<const bool>(reinterpret_cast<const bool*>(pad_store.data()), tc.B, Lk);
      if (tc.cross)
        m.forward(qp.view(), kp.view(), vp.view(), out.view(), opt);
      else
        m.forward(qp.view(), out.view(), opt);
      const auto ref = mha_ref<double>(c, w, "", cast_vector<double>(q), cast_vector<double>(k),
                                       cast_vector<double>(v), tc.B, tc.Lq, Lk, tc.mask);
      const auto naive = mha_ref<float>(c, w, "", q, k, v, tc.B, tc.Lq, Lk, tc.mask);
      REQUIRE(out.guards_intact());
      require_close(out.dense(), ref, naive);
    }
  }
}

TEST_CASE("transformer_layer matches the double-precision reference", "[layers]") {
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre})
    for (auto act : {alibi::activation::gelu, alibi::activation::gelu_tanh})
      for (bool causal : {false, true}) {
        DYNAMIC_SECTION((norm == alibi::norm_position::post ? "post-norm" : "pre-norm")
                        << (act == alibi::activation::gelu ? ", gelu" : ", gelu_tanh")
                        << (causal ? ", causal" : ", bidirectional")) {
          alibi::layer_config lc;
          lc.attention.embed_dim = 48;
          lc.attention.q_heads = 6;
          lc.attention.kv_heads = causal ? 2 : 0;
          lc.ff_dim = 80;
          lc.norm = norm;
          lc.act = act;
          alibi::transformer_layer<float, cpu> layer(lc, cpu{2});
          const auto& c = layer.config();
          const weight_map w = random_weights(layer, 11);
          set_all(layer, w);
          const index_t B = 3, L = 45, E = c.attention.embed_dim;
          mask_args m;
          m.causal = causal;
          m.q_len = m.k_len = {45, 17, 1};
          const auto x = randn(B * L * E, 5);
          const padded_rows xp(x, B, L, E, m.q_len);
          guarded_out out(B, L, E);
          std::vector<index_t> qs, ks;
          layer.forward(xp.view(), out.view(), options_for(m, qs, ks));
          const auto ref = layer_ref<double>(c, w, cast_vector<double>(x), B, L, m);
          const auto naive = layer_ref<float>(c, w, x, B, L, m);
          REQUIRE(out.guards_intact());
          require_close(out.dense(), ref, naive);
        }
      }
}

TEST_CASE("transformer_layer: RMSNorm, gated FFN, SiLU, LayerNorm without bias", "[layers]") {
  struct variant {
    const char* name;
    alibi::norm_type kind;
    bool norm_bias;
    alibi::ffn_type ffn;
    alibi::activation act;
  };
  const variant variants[] = {{"RMSNorm, gated SiLU", alibi::norm_type::rms_norm, false,
                               alibi::ffn_type::gated, alibi::activation::silu},
                              {"LayerNorm without bias, gelu", alibi::norm_type::layer_norm, false,
                               alibi::ffn_type::mlp, alibi::activation::gelu},
                              {"LayerNorm, plain SiLU", alibi::norm_type::layer_norm, true,
                               alibi::ffn_type::mlp, alibi::activation::silu},
                              {"LayerNorm, gated gelu_tanh", alibi::norm_type::layer_norm, true,
                               alibi::ffn_type::gated, alibi::activation::gelu_tanh}};
  for (const variant& v : variants)
    for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre})
      DYNAMIC_SECTION(
          v.name << (norm == alibi::norm_position::post ? ", post-norm" : ", pre-norm")) {
        alibi::layer_config lc;
        lc.attention.embed_dim = 40;
        lc.attention.q_heads = 5;
        lc.ff_dim = 72;
        lc.norm = norm;
        lc.norm_kind = v.kind;
        lc.norm_bias = v.norm_bias;
        lc.ffn = v.ffn;
        lc.act = v.act;
        alibi::transformer_layer<float, cpu> layer(lc, cpu{2});
        const auto& c = layer.config();
        const weight_map w = random_weights(layer, 12);
        // The parameters the options imply, and no others.
        REQUIRE(w.count("ffn.gate.weight") == (v.ffn == alibi::ffn_type::gated ? 1u : 0u));
        REQUIRE(w.count("norm1.bias") == (v.norm_bias ? 1u : 0u));
        set_all(layer, w);
        const index_t B = 2, L = 33, E = 40;
        mask_args m;
        m.causal = true;
        m.q_len = m.k_len = {33, 9};
        const auto x = randn(B * L * E, 6);
        const padded_rows xp(x, B, L, E, m.q_len);
        guarded_out out(B, L, E);
        std::vector<index_t> qs, ks;
        layer.forward(xp.view(), out.view(), options_for(m, qs, ks));
        const auto ref = layer_ref<double>(c, w, cast_vector<double>(x), B, L, m);
        const auto naive = layer_ref<float>(c, w, x, B, L, m);
        REQUIRE(out.guards_intact());
        require_close(out.dense(), ref, naive);
      }
}

TEST_CASE("layers: SiLU saturates without NaN (x / (1 + exp(-x)) at +-inf of exp)", "[layers]") {
  // exp(-x) overflows to inf for x < -88 in fp32: the quotient must be -0, and large
  // positive x must give x. Eigen's vectorized path and its scalar tail both run (13 values).
  using ops = alibi::detail::layer_ops<cpu>;
  const std::vector<float> x = {-1e30f, -1000.0f, -104.0f, -89.0f, -88.0f,  -20.0f, -1.0f,
                                0.0f,   1.0f,     20.0f,   88.0f,  1000.0f, 1e30f};
  std::vector<float> y(x.size(), nan_f);
  const index_t n = static_cast<index_t>(x.size());
  ops::activation_forward(cpu{1}, x.data(), n, y.data(), n, 1, n, alibi::activation::silu);
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i] << ", silu = " << y[i]);
    REQUIRE_FALSE(std::isnan(y[i]));
    const double want = static_cast<double>(x[i]) / (1.0 + std::exp(-static_cast<double>(x[i])));
    REQUIRE(std::fabs(y[i] - want) <= 4e-7 * std::max(1.0, std::fabs(want)));
  }
}

TEST_CASE("norm_layer: LayerNorm and RMSNorm rows match the reference, in place too", "[layers]") {
  for (auto kind : {alibi::norm_type::layer_norm, alibi::norm_type::rms_norm})
    for (bool bias : {true, false})
      DYNAMIC_SECTION((kind == alibi::norm_type::rms_norm ? "RMSNorm" : "LayerNorm")
                      << (bias ? ", bias" : ", no bias")) {
        alibi::norm_layer<float, cpu> n({24, kind, bias, 1e-6f}, cpu{2});
        REQUIRE(n.parameters().size() == (bias && kind == alibi::norm_type::layer_norm ? 2u : 1u));
        const weight_map w = random_weights(n, 4);
        set_all(n, w);
        const index_t B = 3, L = 7, E = 24;
        const auto x = randn(B * L * E, 2);
        const padded_rows xp(x, B, L, E);
        guarded_out out(B, L, E);
        n.forward(xp.view(), out.view());
        std::vector<double> ref = cast_vector<double>(x);
        std::vector<float> naive = x;
        const bool rms = kind == alibi::norm_type::rms_norm;
        norm_ref(ref, B * L, E, w.at("weight"), optional(w, "bias"), 1e-6, rms);
        norm_ref(naive, B * L, E, w.at("weight"), optional(w, "bias"), 1e-6f, rms);
        REQUIRE(out.guards_intact());
        require_close(out.dense(), ref, naive);
        std::vector<float> inplace = x;
        const auto v = alibi::make_view(inplace.data(), B, L, E);
        n.forward(v, v);
        REQUIRE(inplace == out.dense());
      }
  REQUIRE_THROWS_WITH((alibi::norm_layer<float, cpu>({0})),
                      Catch::Contains("config.dim must be > 0"));
  // eps = 0 divided by zero on constant rows (padding): refused.
  REQUIRE_THROWS_WITH(
      (alibi::norm_layer<float, cpu>({24, alibi::norm_type::layer_norm, true, 0.0f})),
      Catch::Contains("config.eps must be finite and > 0"));
  alibi::layer_config lc;
  lc.attention.embed_dim = 8;
  lc.attention.q_heads = 2;
  lc.norm_eps = 0.0f;
  REQUIRE_THROWS_WITH((alibi::transformer_layer<float, cpu>(lc)),
                      Catch::Contains("config.norm_eps must be finite and > 0"));
  // Negative extents made size() positive over a view that addresses nothing.
  alibi::norm_layer<float, cpu> n({4});
  std::vector<float> buf(4);
  const auto neg = alibi::make_strided_view<float, 3>(buf.data(), {-2, -3, 4}, {12, 4, 1});
  REQUIRE_THROWS_WITH(n.forward(neg, neg), Catch::Contains("extents must be >= 0"));
}

TEST_CASE("transformer_layer works in place (out = x)", "[layers]") {
  alibi::layer_config lc;
  lc.attention.embed_dim = 32;
  lc.attention.q_heads = 4;
  for (auto norm : {alibi::norm_position::post, alibi::norm_position::pre}) {
    lc.norm = norm;
    alibi::transformer_layer<float, cpu> layer(lc, cpu{1});
    set_all(layer, random_weights(layer, 3));
    auto x = randn(2 * 20 * 32, 9);
    std::vector<float> separate(x.size());
    layer.forward(alibi::make_view<const float>(x.data(), 2, 20, 32),
                  alibi::make_view(separate.data(), 2, 20, 32));
    layer.forward(alibi::make_view<const float>(x.data(), 2, 20, 32),
                  alibi::make_view(x.data(), 2, 20, 32));
    REQUIRE(x == separate);
  }
}

TEST_CASE("layers: one-token rows sliced from a longer batch (row stride = batch stride)",
          "[layers]") {
  alibi::mha_config c;
  c.embed_dim = 32;
  c.q_heads = 4;
  alibi::multi_head_attention<float, cpu> m(c);
  set_all(m, random_weights(m, 8));
  const index_t B = 3, L = 5, E = 32;
  const auto x = randn(B * L * E, 4);
  std::vector<float> sliced(static_cast<std::size_t>(B * L * E), 0.0f), dense(B * E, 0.0f);
  std::vector<float> x2(static_cast<std::size_t>(B * E));
  for (index_t b = 0; b < B; ++b) std::copy_n(x.begin() + (b * L + 2) * E, E, x2.begin() + b * E);
  // Token 2 of every sequence, in place in (B, L, E) memory: strides (L E, E, 1).
  m.forward(alibi::make_strided_view<const float, 3>(x.data() + 2 * E, {B, 1, E}, {L * E, E, 1}),
            alibi::make_strided_view<float, 3>(sliced.data() + 2 * E, {B, 1, E}, {L * E, E, 1}));
  m.forward(alibi::make_view<const float>(x2.data(), B, 1, E),
            alibi::make_view(dense.data(), B, 1, E));
  for (index_t b = 0; b < B; ++b)
    REQUIRE(std::equal(dense.begin() + b * E, dense.begin() + (b + 1) * E,
                       sliced.begin() + (b * L + 2) * E));
}

TEST_CASE(
    "layers: projections of a few rows (decoding) against double; a row's bits depend on "
    "neither the number of rows nor the thread count",
    "[layers]") {
  using ops = alibi::detail::layer_ops<cpu>;
  constexpr double eps = std::numeric_limits<float>::epsilon();
  // in: with a scalar tail, whole packets; out: groups of 8 weight rows with a tail, more
  // than one block of 128 columns. 16 rows take the few-rows products, 17 Eigen's GEMM.
  for (index_t in : {1, 37, 1000, 1024})
    for (index_t out : {1, 9, 300})
      for (bool accumulate : {false, true}) {
        const index_t rows = 17, ldx = in + 3, ldy = out + 5;  // strided rows
        const auto x = randn(rows * ldx, 11), w = randn(out * in, 12), bias = randn(out, 13);
        const auto y0 = randn(rows * ldy, 14);
        auto run = [&](index_t m, int threads) {
          std::vector<float> y = y0;
          ops::linear<float>(cpu{threads}, x.data(), ldx, m, in, w.data(), bias.data(), out,
                             y.data(), ldy, accumulate, nullptr);
          return y;
        };
        const std::vector<float> few = run(16, 1), gemm = run(17, 1);
        // An inner product of n terms in any order (products rounded or fused) errs by at most
        // gamma(n) times the sum of their magnitudes (Higham, Accuracy and Stability of
        // Numerical Algorithms, 3.1); adding the bias and y0 makes it gamma(n + 2).
        const double gamma = (in + 2) * eps / (1 - (in + 2) * eps);
        for (index_t r = 0; r < rows; ++r)
          for (index_t c = 0; c < out; ++c) {
            const std::size_t at = static_cast<std::size_t>(r * ldy + c);
            double ref = bias[static_cast<std::size_t>(c)], mag = std::abs(ref);
            if (accumulate) {
              ref += y0[at];
              mag += std::abs(y0[at]);
            }
            for (index_t e = 0; e < in; ++e) {
              const double p = static_cast<double>(x[static_cast<std::size_t>(r * ldx + e)]) *
                               w[static_cast<std::size_t>(c * in + e)];
              ref += p;
              mag += std::abs(p);
            }
            INFO("in " << in << " out " << out << " accumulate " << accumulate << " row " << r
                       << " column " << c);
            REQUIRE(std::abs(gemm[at] - ref) <= gamma * mag);
            if (r < 16) REQUIRE(std::abs(few[at] - ref) <= gamma * mag);
          }
        // Padding between the rows is untouched, and row 16 by the call of 16 rows.
        REQUIRE(std::equal(few.begin() + 16 * ldy, few.end(), y0.begin() + 16 * ldy));
        for (index_t r = 0; r < rows; ++r)
          for (index_t c = out; c < ldy; ++c) {
            const std::size_t at = static_cast<std::size_t>(r * ldy + c);
            REQUIRE(few[at] == y0[at]);
            REQUIRE(gemm[at] == y0[at]);
          }
        for (index_t m : {1, 2, 3, 5, 15}) {
          const std::vector<float> part = run(m, 1);
          for (index_t r = 0; r < 16; ++r)
            REQUIRE(std::equal(part.begin() + r * ldy, part.begin() + (r + 1) * ldy,
                               (r < m ? few : y0).begin() + r * ldy));
        }
        REQUIRE(run(16, 2) == few);
        REQUIRE(run(16, 3) == few);
      }
}

TEMPLATE_TEST_CASE(
    "layers: a sequence's prompt and decode steps give the same bits alone and in "
    "a batch (at most 16 rows per call)",
    "[layers]", float, Eigen::half) {
  using S = TestType;
  alibi::layer_config lc;
  lc.attention.embed_dim = 72;  // rows of 288 bytes: half start off a 64-byte line
  lc.attention.q_heads = 8;
  lc.attention.kv_heads = 2;
  // Hidden rows of 1192 bytes: a sequence's rows lie at different offsets from a 16-, 32- or
  // 64-byte boundary alone and in the batch, so a vectorized activation's scalar head (if
  // any) would differ.
  lc.ff_dim = 298;
  const bool llama_like = GENERATE(false, true);
  if (llama_like) {  // the other activation, norm and feed-forward network
    lc.norm = alibi::norm_position::pre;
    lc.norm_kind = alibi::norm_type::rms_norm;
    lc.ffn = alibi::ffn_type::gated;
    lc.act = alibi::activation::silu;
  }
  alibi::transformer_layer<float, cpu> layer(lc, cpu{2});
  set_all(layer, random_weights(layer, 21));
  const index_t B = 3, E = 72, prompt = 5, steps = 3;  // B * prompt = 15 rows: few-rows products
  const auto x = randn(B * (prompt + steps) * E, 22);  // (B, prompt + steps, E)
  alibi::forward_options o;
  o.mask.causal = true;
  // Runs sequences [b0, b0 + n) together: the prompt, then one token per step; returns every
  // output row, (n, prompt + steps, E).
  auto run = [&](index_t b0, index_t n) {
    auto cache = alibi::kv_cache<float, cpu, S>::for_module(layer, n, prompt + steps);
    const index_t T = prompt + steps;
    std::vector<float> in(static_cast<std::size_t>(n * prompt * E)),
        out(static_cast<std::size_t>(n * T * E));
    for (index_t b = 0; b < n; ++b)
      std::copy_n(x.begin() + (b0 + b) * T * E, prompt * E, in.begin() + b * prompt * E);
    layer.forward(alibi::make_view<const float>(in.data(), n, prompt, E),
                  alibi::make_view(in.data(), n, prompt, E), cache, o);
    for (index_t b = 0; b < n; ++b)
      std::copy_n(in.begin() + b * prompt * E, prompt * E, out.begin() + b * T * E);
    for (index_t t = prompt; t < T; ++t) {
      std::vector<float> tok(static_cast<std::size_t>(n * E));
      for (index_t b = 0; b < n; ++b)
        std::copy_n(x.begin() + ((b0 + b) * T + t) * E, E, tok.begin() + b * E);
      layer.forward(alibi::make_view<const float>(tok.data(), n, 1, E),
                    alibi::make_view(tok.data(), n, 1, E), cache, o);
      for (index_t b = 0; b < n; ++b)
        std::copy_n(tok.begin() + b * E, E, out.begin() + (b * T + t) * E);
    }
    return out;
  };
  const std::vector<float> batch = run(0, B);
  const index_t T = prompt + steps;
  for (index_t b = 0; b < B; ++b) {
    const std::vector<float> alone = run(b, 1);
    REQUIRE(std::equal(alone.begin(), alone.end(), batch.begin() + b * T * E));
  }
}

TEST_CASE("layers: results do not depend on the thread count (bitwise)", "[layers]") {
  alibi::layer_config lc;
  lc.attention.embed_dim = 64;
  lc.attention.q_heads = 8;
  lc.ff_dim = 600;                       // more than one 512-column GEMM block
  const index_t B = 2, L = 300, E = 64;  // more than one 256-row GEMM block
  const auto x = randn(B * L * E, 1);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3}) {
    alibi::transformer_layer<float, cpu> layer(lc, cpu{threads});
    set_all(layer, random_weights(layer, 2));
    std::vector<float> out(x.size());
    alibi::forward_options o;
    o.mask.causal = true;
    layer.forward(alibi::make_view<const float>(x.data(), B, L, E),
                  alibi::make_view(out.data(), B, L, E), o);
    outs.push_back(out);
  }
  REQUIRE(outs[0] == outs[1]);
  REQUIRE(outs[0] == outs[2]);
}

namespace {

/// For the references of a stack decoded through caches of storage type S: replaces the
/// projected keys and values with those the layer's cache holds, after checking that each
/// stored value is the projection rounded to S (within one unit of S's last place: the
/// layer rounds its own fp32 projection, which may lie on the other side of a rounding
/// boundary). Why replace: rounding to S is not continuous, so a reference that rounded its
/// own projections would differ from a correct layer by a whole unit wherever the two
/// projections straddle a boundary; with the stored values the references and the layer
/// compute from the same numbers, and the fp32 tolerance rule applies.
template <class S>
struct stored_kv {
  const alibi::kv_cache<float, cpu, S>* cache;
  std::vector<index_t> lengths;
  index_t* misrounded;
  template <class V>
  void operator()(V& k, V& v) const {
    const index_t B = cache->batch(), Hkv = cache->kv_heads(), D = cache->head_dim();
    const index_t L = static_cast<index_t>(k.size()) / (B * Hkv * D);
    // Machine epsilon of S: 10 (fp16) or 7 (bf16) stored fraction bits.
    const double eps = std::is_same<S, Eigen::half>::value ? 0x1p-10 : 0x1p-7;
    for (auto [ref, stored] : {std::pair{&k, cache->keys()}, std::pair{&v, cache->values()}})
      for (index_t b = 0; b < B; ++b)
        for (index_t j = 0; j < lengths[static_cast<std::size_t>(b)]; ++j)
          for (index_t h = 0; h < Hkv; ++h)
            for (index_t d = 0; d < D; ++d) {
              auto& x = (*ref)[static_cast<std::size_t>(((b * L + j) * Hkv + h) * D + d)];
              const double s = static_cast<double>(static_cast<float>(stored(b, h, j, d)));
              const double xd = static_cast<double>(x);
              if (!(std::abs(s - xd) <= eps * std::abs(xd) + 1e-5)) ++*misrounded;
              x = static_cast<typename V::value_type>(s);
            }
  }
};

/// Runs a stack of layers over whole sequences, and the same stack incrementally: a prefill
/// of per-sequence prompt lengths, then steps appending `step(b)` tokens per sequence.
/// Every incremental output row must match the full causal reference like the full forward.
/// S: the caches' storage type (the references then read the keys and values it holds).
template <class S = float>
void check_decode_equals_prefill(alibi::norm_position norm, index_t Hkv) {
  alibi::layer_config lc;
  lc.attention.embed_dim = 48;
  lc.attention.q_heads = 6;
  lc.attention.kv_heads = Hkv;
  lc.ff_dim = 96;
  lc.norm = norm;
  const index_t B = 3, E = 48, n_layers = 2;
  const std::vector<index_t> total = {40, 23, 31};  // tokens per sequence at the end
  const std::vector<index_t> prompt = {9, 1, 17};
  const index_t L = 40;
  std::vector<alibi::transformer_layer<float, cpu>> layers;
  std::vector<weight_map> weights;
  for (index_t l = 0; l < n_layers; ++l) {
    layers.emplace_back(lc, cpu{2});
    weights.push_back(random_weights(layers.back(), 100 + static_cast<unsigned>(l)));
    set_all(layers.back(), weights.back());
  }
  const auto x = randn(B * L * E, 42);  // token embeddings (batch, L, E)

  // Incremental: chunks of new tokens per sequence, gathered into a (batch, n, E) input.
  std::vector<alibi::kv_cache<float, cpu, S>> caches;
  for (auto& layer : layers)
    caches.push_back(alibi::kv_cache<float, cpu, S>::for_module(layer, B, 48));
  std::vector<float> got(static_cast<std::size_t>(B * L * E), nan_f);
  std::vector<index_t> done(B, 0);
  int step = 0;
  while (done != total) {
    std::vector<index_t> n(B);
    for (index_t b = 0; b < B; ++b) {
      const index_t want =
          step == 0 ? prompt[b] : (step % 4 == 3 ? 3 : (b == 1 && step % 2 ? 0 : 1));
      n[b] = std::min(want, total[b] - done[b]);
    }
    const index_t width = *std::max_element(n.begin(), n.end());
    std::vector<float> in(static_cast<std::size_t>(B * width * E), nan_f);
    for (index_t b = 0; b < B; ++b)
      std::copy_n(x.begin() + (b * L + done[b]) * E, n[b] * E, in.begin() + b * width * E);
    alibi::forward_options o;
    o.mask.causal = true;
    o.q_lengths = alibi::make_view<const index_t>(n.data(), B);
    for (index_t l = 0; l < n_layers; ++l)
      layers[static_cast<std::size_t>(l)].forward(
          alibi::make_view<const float>(in.data(), B, width, E),
          alibi::make_view(in.data(), B, width, E), caches[static_cast<std::size_t>(l)], o);
    for (index_t b = 0; b < B; ++b) {
      std::copy_n(in.begin() + b * width * E, n[b] * E, got.begin() + (b * L + done[b]) * E);
      for (index_t i = n[b]; i < width; ++i)  // padded rows come back as zeros
        for (index_t e = 0; e < E; ++e)
          REQUIRE(in[static_cast<std::size_t>((b * width + i) * E + e)] == 0.0f);
      done[b] += n[b];
      REQUIRE(caches[0].length(b) == done[b]);
    }
    ++step;
  }
  for (index_t b = 0; b < B; ++b)
    for (index_t i = total[b]; i < L; ++i) std::fill_n(got.begin() + (b * L + i) * E, E, 0.0f);

  // Reference: the full causal forward of every sequence through the stack.
  mask_args m;
  m.causal = true;
  m.q_len = m.k_len = total;
  auto ref = cast_vector<double>(x);
  std::vector<float> naive = x;
  index_t misrounded = 0;
  for (index_t l = 0; l < n_layers; ++l) {
    const auto& w = weights[static_cast<std::size_t>(l)];
    if constexpr (std::is_same<S, float>::value) {
      ref = layer_ref<double>(layers[0].config(), w, ref, B, L, m);
      naive = layer_ref<float>(layers[0].config(), w, naive, B, L, m);
    } else {
      const stored_kv<S> hook{&caches[static_cast<std::size_t>(l)], total, &misrounded};
      ref = layer_ref<double>(layers[0].config(), w, ref, B, L, m, no_rounding{}, hook);
      naive = layer_ref<float>(layers[0].config(), w, naive, B, L, m, no_rounding{}, hook);
    }
  }
  CHECK(misrounded == 0);
  require_close(got, ref, naive);
}

}  // namespace

TEST_CASE("KV cache: prefill + decode steps equal the full causal forward", "[layers][decode]") {
  SECTION("post-norm, MHA") { check_decode_equals_prefill(alibi::norm_position::post, 0); }
  SECTION("pre-norm, GQA 6/2") { check_decode_equals_prefill(alibi::norm_position::pre, 2); }
  SECTION("pre-norm, MQA") { check_decode_equals_prefill(alibi::norm_position::pre, 1); }
  SECTION("pre-norm, GQA 6/2, fp16 cache") {
    check_decode_equals_prefill<Eigen::half>(alibi::norm_position::pre, 2);
  }
  SECTION("post-norm, MHA, bf16 cache") {
    check_decode_equals_prefill<Eigen::bfloat16>(alibi::norm_position::post, 0);
  }
}

TEMPLATE_TEST_CASE("KV cache: the stored keys and values are the projections, heads outermost",
                   "[layers][decode]", float, Eigen::half) {
  // GQA (4 query heads on 2 KV heads of dim 4), two sequences appended unevenly: 3 tokens
  // (a copy per head) and 1, then 1 and 1, then 2 and 0 (copies per token).
  using S = TestType;
  alibi::mha_config c;
  c.embed_dim = 16;
  c.q_heads = 4;
  c.kv_heads = 2;
  alibi::multi_head_attention<float, cpu> m(c);
  const weight_map w = random_weights(m, 5);
  set_all(m, w);
  const index_t E = 16, Hkv = 2, D = 4, cap = 9;
  auto cache = alibi::kv_cache<float, cpu, S>::for_module(m, 2, cap);
  std::vector<std::vector<float>> tokens(2);  // each sequence's inputs, E per token
  const std::vector<std::vector<index_t>> steps = {{3, 1}, {1, 1}, {2, 0}};
  alibi::forward_options o;
  o.mask.causal = true;
  unsigned seed = 20;
  for (const auto& n : steps) {
    const index_t L = std::max(n[0], n[1]);
    const auto x = randn(2 * L * E, seed++);
    std::vector<float> out(x.size());
    o.q_lengths = alibi::make_view<const index_t>(n.data(), 2);
    m.forward(alibi::make_view<const float>(x.data(), 2, L, E),
              alibi::make_view(out.data(), 2, L, E), cache, o);
    for (index_t b = 0; b < 2; ++b)
      tokens[static_cast<std::size_t>(b)].insert(
          tokens[static_cast<std::size_t>(b)].end(), x.begin() + b * L * E,
          x.begin() + (b * L + n[static_cast<std::size_t>(b)]) * E);
  }
  REQUIRE(cache.length(0) == 6);
  REQUIRE(cache.length(1) == 2);
  for (const auto& view : {cache.keys(), cache.values()}) {
    const bool keys = view.data == cache.keys().data;
    // Heads outermost: each head's rows one contiguous run of the capacity.
    CHECK(view.strides[0] == Hkv * cap * D);
    CHECK(view.strides[1] == cap * D);
    CHECK(view.strides[2] == D);
    CHECK(view.strides[3] == 1);
    const named_tensor& wt = w.at(keys ? "k_proj.weight" : "v_proj.weight");
    const named_tensor& bt = w.at(keys ? "k_proj.bias" : "v_proj.bias");
    for (index_t b = 0; b < 2; ++b)
      for (index_t t = 0; t < cache.length(b); ++t)
        for (index_t h = 0; h < Hkv; ++h)
          for (index_t e = 0; e < D; ++e) {
            const index_t r = h * D + e;  // the projection's output feature
            double want = bt.data[static_cast<std::size_t>(r)], mag = std::fabs(want);
            for (index_t i = 0; i < E; ++i) {
              const double p =
                  static_cast<double>(wt.data[static_cast<std::size_t>(r * E + i)]) *
                  tokens[static_cast<std::size_t>(b)][static_cast<std::size_t>(t * E + i)];
              want += p;
              mag += std::fabs(p);
            }
            // The float GEMM's rounding, then (fp16) the rounding to S: half an ulp, 2^-11.
            const double tol =
                1e-5 * mag + (std::is_same<S, float>::value ? 0.0 : 0x1p-11 * std::fabs(want));
            INFO((keys ? "keys" : "values")
                 << ": b " << b << " t " << t << " h " << h << " e " << e);
            CHECK(std::fabs(static_cast<double>(static_cast<float>(view(b, h, t, e))) - want) <=
                  tol);
          }
  }
}

TEST_CASE("KV cache: clear, capacity and misuse", "[layers][decode]") {
  alibi::mha_config c;
  c.embed_dim = 16;
  c.q_heads = 2;
  alibi::multi_head_attention<float, cpu> m(c);
  set_all(m, random_weights(m, 1));
  auto cache = alibi::kv_cache<float, cpu>::for_module(m, 2, 8);
  auto x = randn(2 * 5 * 16, 3);
  std::vector<float> out(x.size());
  auto xv = alibi::make_view<const float>(x.data(), 2, 5, 16);
  auto ov = alibi::make_view(out.data(), 2, 5, 16);
  alibi::forward_options o;
  o.mask.causal = true;
  m.forward(xv, ov, cache, o);
  REQUIRE(cache.length(0) == 5);
  // Rolled back and run again, the same tokens give the same outputs.
  const std::vector<float> first = out;
  cache.truncate(0, 0);
  cache.truncate(1, 0);
  m.forward(xv, ov, cache, o);
  REQUIRE(out == first);
  REQUIRE(cache.keys().extents[2] == 5);
  // A second 5-token chunk does not fit in 8.
  REQUIRE_THROWS_WITH(m.forward(xv, ov, cache, o), Catch::Contains("capacity 8"));
  REQUIRE(cache.length(0) == 5);  // a refused call changes nothing
  cache.truncate(0, 2);
  REQUIRE(cache.length(0) == 2);
  REQUIRE_THROWS_WITH(cache.truncate(0, 3), Catch::Contains("length must be in [0, 2]"));
  cache.clear(0);
  std::vector<index_t> n = {3, 0};
  o.q_lengths = alibi::make_view<const index_t>(n.data(), 2);
  m.forward(xv, ov, cache, o);
  REQUIRE(cache.length(0) == 3);
  REQUIRE(cache.length(1) == 5);
  std::vector<index_t> kl = {1, 1};
  o.k_lengths = alibi::make_view<const index_t>(kl.data(), 2);
  REQUIRE_THROWS_WITH(m.forward(xv, ov, cache, o), Catch::Contains("kv_cache"));
  auto wrong = alibi::kv_cache<float, cpu>(cpu{}, 2, 8, 1, 8);
  o.k_lengths = {};
  REQUIRE_THROWS_WITH(m.forward(xv, ov, wrong, o), Catch::Contains("kv_heads 1"));
  REQUIRE_THROWS_AS((alibi::kv_cache<float, cpu>(cpu{}, -1, 8, 1, 8)), alibi::error);
  // The cache appends one key and value row per query row: fewer (or more) key rows than
  // query rows would be read past their end, or appended wrongly.
  cache.clear(0);
  cache.clear(1);
  o.q_lengths = {};
  const auto k1 = alibi::make_view<const float>(x.data(), 2, 1, 16);
  REQUIRE_THROWS_WITH(m.forward_into(xv, k1, k1, ov, o, &cache, false),
                      Catch::Contains("extent(1) must be q_len = 5, got 1"));
  // A null k_lengths or key mask with extents is given, not omitted.
  o.k_lengths = alibi::make_view<const index_t>(nullptr, 2);
  REQUIRE_THROWS_WITH(m.forward(xv, ov, cache, o), Catch::Contains("kv_cache"));
  REQUIRE(cache.length(0) == 0);
}

TEST_CASE("layers: batches of empty sequences and calls without keys", "[layers][edge]") {
  // E1: (2, 0, E) inputs give empty outputs; E2: queries without keys give attention 0, so
  // the module's output is its output projection's bias.
  alibi::mha_config c;
  c.embed_dim = 16;
  c.q_heads = 2;
  alibi::multi_head_attention<float, cpu> m(c);
  set_all(m, random_weights(m, 2));
  std::vector<float> x = randn(2 * 3 * 16, 4), out(x.size(), -1.0f);
  const auto none = alibi::make_view<const float>(x.data(), 2, 0, 16);
  REQUIRE_NOTHROW(m.forward(none, alibi::make_view(out.data(), 2, 0, 16)));
  REQUIRE(out[0] == -1.0f);
  m.forward(alibi::make_view<const float>(x.data(), 2, 3, 16), none, none,
            alibi::make_view(out.data(), 2, 3, 16));
  const std::vector<float> bias = m.get("out_proj.bias");
  for (index_t r = 0; r < 6; ++r)
    for (index_t e = 0; e < 16; ++e)
      CHECK(out[static_cast<std::size_t>(r * 16 + e)] == bias[static_cast<std::size_t>(e)]);
  alibi::layer_config lc;
  lc.attention = c;
  lc.ff_dim = 32;
  alibi::transformer_layer<float, cpu> layer(lc);
  REQUIRE_NOTHROW(layer.forward(none, alibi::make_view(out.data(), 2, 0, 16)));
  alibi::norm_config nc;
  nc.dim = 16;
  alibi::norm_layer<float, cpu> norm(nc);
  REQUIRE_NOTHROW(norm.forward(none, alibi::make_view(out.data(), 2, 0, 16)));
}

TEST_CASE("layers: impossible sizes are refused before anything is allocated", "[layers][errors]") {
  alibi::mha_config c;
  c.embed_dim = index_t(1) << 31;  // q_proj.weight alone: 2^62 floats, 2^64 bytes
  c.q_heads = 16;
  REQUIRE_THROWS_WITH((alibi::multi_head_attention<float, cpu>(c)),
                      Catch::Contains("alibi::multi_head_attention: parameter 'q_proj.weight'") &&
                          Catch::Contains("(2147483648, 2147483648)"));
  c.embed_dim = 64;
  c.head_dim = index_t(1) << 62;
  REQUIRE_THROWS_WITH((alibi::multi_head_attention<float, cpu>(c)),
                      Catch::Contains("config.q_heads * config.head_dim"));
  alibi::layer_config lc;
  lc.attention.embed_dim = 64;
  lc.attention.q_heads = 4;
  lc.ff_dim = index_t(1) << 61;  // ffn.0.weight: 2^67 floats
  REQUIRE_THROWS_WITH((alibi::transformer_layer<float, cpu>(lc)),
                      Catch::Contains("alibi::transformer_layer: parameter 'ffn.0.weight'"));
}

TEST_CASE("layers: configuration and argument errors name the argument", "[layers][errors]") {
  alibi::mha_config c;
  c.embed_dim = 30;
  c.q_heads = 4;
  REQUIRE_THROWS_WITH((alibi::multi_head_attention<float, cpu>(c)),
                      Catch::Contains("set config.head_dim"));
  c.q_heads = 6;
  c.kv_heads = 4;
  REQUIRE_THROWS_WITH((alibi::multi_head_attention<float, cpu>(c)),
                      Catch::Contains("config.kv_heads (4) must divide"));
  c.kv_heads = 0;
  alibi::multi_head_attention<float, cpu> m(c);
  std::vector<float> x(2 * 4 * 30), y(x.size());
  auto ok_out = alibi::make_view(y.data(), 2, 4, 30);
  REQUIRE_THROWS_WITH(m.forward(alibi::make_view<const float>(x.data(), 2, 4, 29),
                                alibi::make_view(y.data(), 2, 4, 29)),
                      Catch::Contains("query.extent(2) must be 30"));
  REQUIRE_THROWS_WITH(m.forward(alibi::make_view<const float>(x.data(), 2, 4, 30),
                                alibi::make_view(y.data(), 2, 3, 30)),
                      Catch::Contains("out must have shape (2, 4, 30)"));
  auto strided = alibi::make_strided_view<const float, 3>(x.data(), {2, 2, 30}, {30, 60, 1});
  REQUIRE_THROWS_WITH(m.forward(strided, alibi::make_view(y.data(), 2, 2, 30)),
                      Catch::Contains("query.stride(0)"));
  std::vector<index_t> bad = {5, 1};
  alibi::forward_options o;
  o.q_lengths = alibi::make_view<const index_t>(bad.data(), 2);
  REQUIRE_THROWS_WITH(m.forward(alibi::make_view<const float>(x.data(), 2, 4, 30), ok_out, o),
                      Catch::Contains("opt.q_lengths(0) must be in [0, 4], got 5"));
  o.q_lengths = {};
  std::vector<char> pad(2 * 3);
  o.key_padding_mask =
      alibi::make_view<const bool>(reinterpret_cast<const bool*>(pad.data()), 2, 3);
  REQUIRE_THROWS_WITH(m.forward(alibi::make_view<const float>(x.data(), 2, 4, 30), ok_out, o),
                      Catch::Contains("opt.key_padding_mask must have shape (2, 4)"));
  // Parameters: unknown names and wrong shapes.
  std::vector<float> w(30 * 30);
  REQUIRE_THROWS_WITH(m.set("q_proj.weights", w.data(), {30, 30}),
                      Catch::Contains("no parameter named 'q_proj.weights'"));
  REQUIRE_THROWS_WITH(m.set("q_proj.weight", w.data(), {30, 29}),
                      Catch::Contains("'q_proj.weight' must have shape (30, 30), got (30, 29)"));
  alibi::layer_config lc;
  lc.attention = c;
  alibi::transformer_layer<float, cpu> layer(lc);
  REQUIRE_THROWS_WITH(layer.set("self_attn.k_proj.bias", w.data(), {31}),
                      Catch::Contains("'k_proj.bias' must have shape (30), got (31)"));
}

TEST_CASE("layers: set() from views and Eigen, get(), and the initial values", "[layers]") {
  alibi::mha_config c;
  c.embed_dim = 8;
  c.q_heads = 2;
  alibi::multi_head_attention<float, cpu> m(c);
  REQUIRE(m.parameters().size() == 8);
  std::vector<float> w(8 * 8);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  // A transposed (column-major) view sets the transpose's values.
  m.set("q_proj.weight", alibi::make_strided_view<const float, 2>(w.data(), {8, 8}, {1, 8}));
  const auto got = m.get("q_proj.weight");
  REQUIRE(got[1] == 8.0f);
  REQUIRE(got[8] == 1.0f);
  // From Eigen: a column-major matrix sets values by index; a vector sets a 1-D parameter.
  Eigen::MatrixXf wk = Eigen::MatrixXf::Zero(8, 8);
  wk(0, 1) = 5.0f;
  alibi::set_parameter(m, "k_proj.weight", wk);
  REQUIRE(m.get("k_proj.weight")[1] == 5.0f);
  alibi::set_parameter(m, "k_proj.bias", Eigen::VectorXd::Constant(8, 0.5));
  REQUIRE(m.get("k_proj.bias") == std::vector<float>(8, 0.5f));
  REQUIRE_THROWS_WITH(alibi::set_parameter(m, "k_proj.bias", Eigen::MatrixXf::Zero(2, 4)),
                      Catch::Contains("must have shape (8), got (2, 4)"));
  // A view of negative extents is refused before anything is read through it (their
  // product, 6, once sized the copy, and the copy read past the one element).
  const float one = 1.0f;
  REQUIRE_THROWS_WITH(
      m.set("q_proj.weight", alibi::make_strided_view<const float, 2>(&one, {-2, -3}, {3, 1})),
      Catch::Contains("alibi::multi_head_attention::set: q_proj.weight.extent(0) must be >= 0"));
  alibi::layer_config lc;
  lc.attention = c;
  alibi::transformer_layer<float, cpu> layer(lc);
  REQUIRE(layer.get("norm1.weight") == std::vector<float>(8, 1.0f));
  REQUIRE(layer.get("norm2.bias") == std::vector<float>(8, 0.0f));
  REQUIRE(layer.config().ff_dim == 32);
}

TEST_CASE("safetensors: round trip, dtypes, metadata and loading modules",
          "[layers][safetensors]") {
  alibi::layer_config lc;
  lc.attention.embed_dim = 32;
  lc.attention.q_heads = 4;
  lc.attention.kv_heads = 2;
  alibi::transformer_layer<float, cpu> a(lc), b(lc);
  const weight_map w = random_weights(a, 5);
  set_all(a, w);
  alibi::safetensors_writer writer;
  alibi::save_parameters(a, writer, "layers.0.");
  writer.metadata("format", "pt \"quoted\" \xC3\xA9");
  const auto bytes = writer.bytes();
  const auto file = alibi::safetensors::parse(bytes, "layer.safetensors");
  REQUIRE(file.metadata().at("format") == "pt \"quoted\" \xC3\xA9");
  REQUIRE(file.info("layers.0.ffn.0.weight").shape == std::vector<index_t>{128, 32});
  alibi::load_parameters(b, file, "layers.0.");
  const auto x = randn(2 * 9 * 32, 1);
  std::vector<float> ya(x.size()), yb(x.size());
  a.forward(alibi::make_view<const float>(x.data(), 2, 9, 32),
            alibi::make_view(ya.data(), 2, 9, 32));
  b.forward(alibi::make_view<const float>(x.data(), 2, 9, 32),
            alibi::make_view(yb.data(), 2, 9, 32));
  REQUIRE(ya == yb);

  // Missing and misshapen tensors.
  REQUIRE_THROWS_WITH(alibi::load_parameters(b, file, "layers.1."),
                      Catch::Contains("has no tensor 'layers.1.self_attn.q_proj.weight'"));
  alibi::safetensors_writer bad;
  alibi::save_parameters(a, bad);
  bad.add("norm1.weight", {31}, std::vector<float>(31, 1.0f));
  REQUIRE_THROWS_WITH(
      alibi::load_parameters(b, alibi::safetensors::parse(bad.bytes(), "bad")),
      Catch::Contains("tensor 'norm1.weight' in bad has shape (31), expected (32)"));

  // F16, BF16 and F64 data, escapes in names, written by hand.
  const std::string header = R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
                             R"("b\u00e9":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                             R"("d":{"dtype":"F64","shape":[1],"data_offsets":[12,20]}})";
  std::vector<unsigned char> raw(8);
  raw[0] = static_cast<unsigned char>(header.size());
  raw.insert(raw.end(), header.begin(), header.end());
  for (unsigned v : {0x3C00u, 0xC000u, 0x0001u, 0x7C00u})  // 1, -2, 2^-24, +inf
    raw.insert(raw.end(),
               {static_cast<unsigned char>(v & 0xFF), static_cast<unsigned char>(v >> 8)});
  for (unsigned v : {0x3F80u, 0xBFC0u})  // 1, -1.5
    raw.insert(raw.end(),
               {static_cast<unsigned char>(v & 0xFF), static_cast<unsigned char>(v >> 8)});
  const double half = 0.5;
  unsigned char d8[8];
  std::memcpy(d8, &half, 8);
  raw.insert(raw.end(), d8, d8 + 8);
  const auto hand = alibi::safetensors::parse(raw);
  REQUIRE(hand.to_float("h") ==
          std::vector<float>{1.0f, -2.0f, 0x1p-24f, std::numeric_limits<float>::infinity()});
  REQUIRE(hand.to_float("b\xC3\xA9") == std::vector<float>{1.0f, -1.5f});
  REQUIRE(hand.to_float("d") == std::vector<float>{0.5f});
}

TEST_CASE("safetensors: corrupt files are clear errors", "[layers][safetensors][errors]") {
  using alibi::safetensors;
  const auto with_header = alibi_test::safetensors_bytes;
  REQUIRE_THROWS_WITH(safetensors::parse({1, 2, 3}),
                      Catch::Contains("shorter than its 8-byte header length"));
  REQUIRE_THROWS_WITH(safetensors::parse({200, 0, 0, 0, 0, 0, 0, 0, '{', '}'}),
                      Catch::Contains("exceeds the file"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header("{\"a\":", 0)),
                      Catch::Contains("invalid header"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header("[1]", 0)),
                      Catch::Contains("not a JSON object"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(
                          R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
                      Catch::Contains("holds 8 bytes, but dtype F32 and its shape need 12"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(
                          R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)),
                      Catch::Contains("lie outside the data section (8 bytes)"));
  // A dtype the reader does not know opens (other tensors stay readable) and is not converted.
  REQUIRE_THROWS_WITH(
      safetensors::parse(with_header(R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1))
          .to_float("a"),
      Catch::Contains("has dtype Q4; expected F32, F16, BF16 or F64"));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(R"({"a":{"shape":[1]}})", 0)),
                      Catch::Contains("needs \"dtype\""));
  REQUIRE_THROWS_WITH(safetensors::parse(with_header(R"({"__metadata__":{"k":1}})", 0)),
                      Catch::Contains("is not a string"));
  REQUIRE_THROWS_WITH(safetensors::read("/nonexistent/alibi.safetensors"),
                      Catch::Contains("cannot open"));
  const auto i32 = safetensors::parse(
      with_header(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4));
  REQUIRE_THROWS_WITH(i32.to_float("a"), Catch::Contains("expected F32, F16, BF16 or F64"));
}

namespace {

/// A cache's key-norm bounds against alibi::key_norm_bounds over each sequence's stored
/// keys, bitwise; blocks past a sequence's length hold 0.
template <class Cache>
void check_key_norm_bounds(const Cache& cache) {
  const auto keys = cache.keys();
  const auto got = cache.key_norm_bounds();
  const index_t H = cache.kv_heads();
  REQUIRE(got.extents[2] == (keys.extents[2] + 127) / 128);
  for (index_t b = 0; b < cache.batch(); ++b) {
    const index_t len = cache.length(b), blocks = (len + 127) / 128;
    const auto kb = alibi::make_strided_view<const typename decltype(keys)::value_type, 4>(
        keys.ptr(b, 0, 0), {1, H, len, cache.head_dim()},
        {keys.strides[0], keys.strides[1], keys.strides[2], keys.strides[3]});
    std::vector<float> want(static_cast<std::size_t>(H * blocks), -1.0f);
    alibi::key_norm_bounds(kb, alibi::make_view(want.data(), 1, H, blocks));
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < got.extents[2]; ++t) {
        const float expected = t < blocks ? want[static_cast<std::size_t>(h * blocks + t)] : 0.0f;
        INFO("b " << b << " h " << h << " block " << t);
        CHECK(got(b, h, t) == expected);
        if (t < blocks) CHECK(got(b, h, t) > 0.0f);
      }
  }
}

/// A 32-feature attention module of 4 query heads on 2 KV heads, with random weights.
struct gqa_module {
  static alibi::mha_config config() {
    alibi::mha_config c;
    c.embed_dim = 32;
    c.q_heads = 4;
    c.kv_heads = 2;
    return c;
  }
  alibi::multi_head_attention<float, cpu> m{config()};
  gqa_module() { set_all(m, random_weights(m, 2)); }
};

}  // namespace

TEST_CASE("KV cache: its key-norm bounds follow appends, truncation and clearing",
          "[layers][decode][skip]") {
  // The cache's bounds (attention_params::key_norm_bounds for its decode steps) against
  // alibi::key_norm_bounds over each sequence's stored keys, bitwise; blocks past a
  // sequence's length hold 0. Lengths cross the 128-key blocks.
  gqa_module g;
  auto& m = g.m;
  auto cache = alibi::kv_cache<float, cpu, Eigen::half>::for_module(m, 2, 400);
  const index_t L = 150;
  auto x = randn(static_cast<std::size_t>(2 * L * 32), 4);
  std::vector<float> out(x.size());
  alibi::forward_options o;
  o.mask.causal = true;
  auto step = [&](index_t n0, index_t n1) {
    std::vector<index_t> n = {n0, n1};
    o.q_lengths = alibi::make_view<const index_t>(n.data(), 2);
    m.forward(alibi::make_view<const float>(x.data(), 2, L, 32),
              alibi::make_view(out.data(), 2, L, 32), cache, o);
  };
  auto check = [&](const char* when) {
    INFO(when);
    check_key_norm_bounds(cache);
  };
  step(L, 100);
  check("after a prompt of 150 and 100 tokens");
  for (int i = 0; i < 3; ++i) step(1, 1);
  check("after three decode steps");
  step(120, 0);
  check("after 120 more tokens in sequence 0 (273: three blocks)");
  cache.truncate(0, 130);
  check("after truncating sequence 0 to 130");
  cache.truncate(0, 100);
  check("after truncating sequence 0 to 100");
  cache.clear(1);
  check("after clearing sequence 1");
  step(5, 7);
  check("after appending to both");
  cache.clear();
  step(3, 0);
  check("after clearing all and a new prompt");
}

TEST_CASE("KV cache: a transaction returns truncated sequences to their fewest tokens",
          "[layers][decode][skip]") {
  // Sequence 0 holds 200 keys (two norm blocks) when the transaction begins; it is truncated
  // to 10 and grows past 200 with other tokens before the step fails. It must come back with
  // 10 keys and their bounds (sequence 1 with its 30), not with 200 and a stale bound.
  gqa_module g;
  auto& m = g.m;
  using cache_t = alibi::kv_cache<float, cpu>;
  auto cache = cache_t::for_module(m, 2, 400);
  const index_t L = 250;
  const auto x = randn(static_cast<std::size_t>(2 * L * 32), 4);
  const auto y = randn(static_cast<std::size_t>(2 * L * 32), 5);
  std::vector<float> out(x.size());
  alibi::forward_options o;
  o.mask.causal = true;
  auto step = [&](const std::vector<float>& in, index_t n0, index_t n1) {
    std::vector<index_t> n = {n0, n1};
    o.q_lengths = alibi::make_view<const index_t>(n.data(), 2);
    m.forward(alibi::make_view<const float>(in.data(), 2, L, 32),
              alibi::make_view(out.data(), 2, L, 32), cache, o);
  };
  step(x, 200, 30);
  const std::vector<float> kept(cache.keys().ptr(0, 1, 0), cache.keys().ptr(0, 1, 10));
  {
    cache_t::transaction t(cache);
    cache.truncate(0, 10);
    step(y, 220, 5);
    REQUIRE(cache.length(0) == 230);
  }
  REQUIRE(cache.length(0) == 10);
  REQUIRE(cache.length(1) == 30);
  REQUIRE(std::vector<float>(cache.keys().ptr(0, 1, 0), cache.keys().ptr(0, 1, 10)) == kept);
  check_key_norm_bounds(cache);
  {  // cleared while open: back to empty
    cache_t::transaction t(cache);
    cache.clear(1);
    step(y, 0, 3);
  }
  REQUIRE(cache.length(1) == 0);
  REQUIRE(cache.length(0) == 10);
  check_key_norm_bounds(cache);
  {  // committed: later truncations are the caller's
    cache_t::transaction t(cache);
    step(y, 5, 0);
    t.commit();
    cache.truncate(0, 12);
  }
  REQUIRE(cache.length(0) == 12);
  {  // two open, the first-begun ended first: the later one returns to no more than it
    std::optional<cache_t::transaction> outer(std::in_place, cache);
    step(y, 140, 0);
    cache_t::transaction inner(cache);
    step(y, 20, 0);
    outer.reset();
    REQUIRE(cache.length(0) == 12);
    step(y, 7, 0);
  }
  REQUIRE(cache.length(0) == 12);
  check_key_norm_bounds(cache);
}
