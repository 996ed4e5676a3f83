// SPDX-License-Identifier: MIT
// The layers on the CUDA backend (float, half, bfloat16): multi_head_attention and
// transformer_layer against the plain double-precision computation of layer_reference.hpp,
// decode == prefill with a device KV cache, and the CPU backend's result for the same layer.
// Inputs are device buffers with NaN in row gaps and padded rows; outputs have guard gaps.
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cuda_common.cuh"
#include "layer_reference.hpp"

// The same layer on the CPU backend (tests/layers/cuda_layers_cpu.cpp: Eigen stays out of .cu files).
std::vector<float> cpu_layer_forward(const alibi::layer_config& c, const alibi_test::weight_map& w,
                                     const std::vector<float>& x, alibi::index_t B,
                                     alibi::index_t L, const std::vector<alibi::index_t>& lengths,
                                     bool causal);

namespace {

using alibi::index_t;
using namespace alibi_test;
using gpu = alibi::backend::cuda;
constexpr float sentinel = 640.0f;  // exact in half and bfloat16

/// Rounds what the naive computation stores between steps to the element type.
template <class T>
struct round_to_element {
  float operator()(float x) const { return round_to<T>(x); }
  double operator()(double x) const { return round_to<T>(static_cast<float>(x)); }
};

template <class T>
std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_to<T>(x);
  return v;
}
template <class T>
weight_map rounded(weight_map w) {
  for (auto& kv : w) kv.second.data = rounded<T>(kv.second.data);
  return w;
}

/// A device (batch, len, features) input in T, row stride features + 3; gaps and rows past
/// each sequence's length hold NaN.
template <class T>
struct device_rows {
  index_t B, L, F, ld;
  device_buffer<T> mem;
  device_rows(const std::vector<float>& dense, index_t B_, index_t L_, index_t F_,
              const std::vector<index_t>& len = {})
      : B(B_), L(L_), F(F_), ld(F_ + 3), mem(host(dense, B_, L_, F_, len)) {}
  static std::vector<T> host(const std::vector<float>& dense, index_t B, index_t L, index_t F,
                             const std::vector<index_t>& len) {
    std::vector<T> h(static_cast<std::size_t>(B * L * (F + 3)),
                     to_element<T>(std::numeric_limits<float>::quiet_NaN()));
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < (len.empty() ? L : len[static_cast<std::size_t>(b)]); ++i)
        for (index_t f = 0; f < F; ++f)
          h[static_cast<std::size_t>((b * L + i) * (F + 3) + f)] =
              to_element<T>(dense[static_cast<std::size_t>((b * L + i) * F + f)]);
    return h;
  }
  alibi::tensor_view<const T, 3> view() const {
    return alibi::make_strided_view<const T, 3>(mem.ptr, {B, L, F}, {L * ld, ld, 1});
  }
};

/// A device output in T with row stride features + 5; the gaps hold a sentinel.
template <class T>
struct device_out {
  index_t B, L, F, ld;
  device_buffer<T> mem;
  device_out(index_t B_, index_t L_, index_t F_)
      : B(B_),
        L(L_),
        F(F_),
        ld(F_ + 5),
        mem(std::vector<T>(static_cast<std::size_t>(B_ * L_ * (F_ + 5)), to_element<T>(sentinel))) {
  }
  alibi::tensor_view<T, 3> view() {
    return alibi::make_strided_view<T, 3>(mem.ptr, {B, L, F}, {L * ld, ld, 1});
  }
  /// The values (batch, len, features) as float; false if a guard changed.
  bool read(std::vector<float>& dense) const {
    cuda_ok(cudaDeviceSynchronize(), "sync");
    const std::vector<T> h = mem.download();
    dense.clear();
    bool guards = true;
    for (index_t r = 0; r < B * L; ++r)
      for (index_t c = 0; c < ld; ++c) {
        const float v = from_element<T>(h[static_cast<std::size_t>(r * ld + c)]);
        if (c < F)
          dense.push_back(v);
        else
          guards = guards && v == sentinel;
      }
    return guards;
  }
};

template <class T>
void require_close(const std::vector<float>& impl, const std::vector<double>& ref,
                   const std::vector<float>& naive) {
  const layer_check c = check_rows(impl, ref, naive);
  INFO(element_name<T>() << ": max |impl - ref64| = " << c.err << ", bound " << c.bound()
                         << " (naive error in that type " << c.naive_err << ", max |ref| "
                         << c.scale << ")");
  REQUIRE_FALSE(c.nan);
  REQUIRE(c.ok());
}

template <class T>
void check_mha(bool cross) {
  alibi::mha_config cfg;
  cfg.embed_dim = cross ? 64 : 128;
  cfg.q_heads = cross ? 2 : 4;
  cfg.kv_heads = cross ? 1 : 2;
  cfg.head_dim = 32;
  if (cross) cfg.key_dim = 48;
  alibi::multi_head_attention<T, gpu> m(cfg, gpu{});
  const auto& c = m.config();
  const weight_map w = rounded<T>(random_weights(m, 3));
  set_all(m, w);
  const index_t B = 2, Lq = cross ? 20 : 70, Lk = cross ? 50 : Lq;
  mask_args mask;
  mask.causal = !cross;
  mask.q_len = cross ? std::vector<index_t>{20, 9} : std::vector<index_t>{70, 33};
  mask.k_len = cross ? std::vector<index_t>{50, 50} : mask.q_len;
  const auto q = rounded<T>(randn(B * Lq * c.embed_dim, 1));
  const auto k = cross ? rounded<T>(randn(B * Lk * c.key_dim, 2)) : q;
  const auto v = cross ? rounded<T>(randn(B * Lk * c.value_dim, 3)) : q;
  std::vector<char> pad;
  alibi::forward_options opt;
  opt.mask.causal = mask.causal;
  opt.q_lengths = alibi::make_view<const index_t>(mask.q_len.data(), B);
  opt.k_lengths = alibi::make_view<const index_t>(mask.k_len.data(), B);
  if (cross) {
    for (index_t i = 0; i < B * Lk; ++i) mask.key_pad.push_back(i % 7 == 3 || i >= Lk + 40);
    pad.assign(mask.key_pad.begin(), mask.key_pad.end());
    opt.key_padding_mask =
        alibi::make_view<const bool>(reinterpret_cast<const bool*>(pad.data()), B, Lk);
  }
  const device_rows<T> qd(q, B, Lq, c.embed_dim, mask.q_len), kd(k, B, Lk, c.key_dim),
      vd(v, B, Lk, c.value_dim);
  device_out<T> out(B, Lq, c.embed_dim);
  if (cross)
    m.forward(qd.view(), kd.view(), vd.view(), out.view(), opt);
  else
    m.forward(qd.view(), out.view(), opt);
  std::vector<float> got;
  REQUIRE(out.read(got));
  const auto ref = mha_ref<double>(c, w, "", cast_vector<double>(q), cast_vector<double>(k),
                                   cast_vector<double>(v), B, Lq, Lk, mask);
  const auto naive = mha_ref<float>(c, w, "", q, k, v, B, Lq, Lk, mask, round_to_element<T>{});
  require_close<T>(got, ref, naive);
}

/// The layer lc (its norm placement and kind, FFN and activation) at 128 features.
template <class T>
void check_layer(alibi::layer_config lc) {
  lc.attention.embed_dim = 128;
  lc.attention.q_heads = 4;
  lc.attention.kv_heads = 2;
  lc.ff_dim = 256;
  alibi::transformer_layer<T, gpu> layer(lc, gpu{});
  const auto& c = layer.config();
  const weight_map w = rounded<T>(random_weights(layer, 9));
  set_all(layer, w);
  const index_t B = 2, L = 65, E = 128;
  mask_args m;
  m.causal = true;
  m.q_len = m.k_len = {65, 40};
  const auto x = rounded<T>(randn(B * L * E, 4));
  const device_rows<T> xd(x, B, L, E, m.q_len);
  device_out<T> out(B, L, E);
  alibi::forward_options opt;
  opt.mask.causal = true;
  opt.q_lengths = alibi::make_view<const index_t>(m.q_len.data(), B);
  opt.k_lengths = opt.q_lengths;
  layer.forward(xd.view(), out.view(), opt);
  std::vector<float> got;
  REQUIRE(out.read(got));
  const auto ref = layer_ref<double>(c, w, cast_vector<double>(x), B, L, m);
  const auto naive = layer_ref<float>(c, w, x, B, L, m, round_to_element<T>{});
  require_close<T>(got, ref, naive);
  if (std::is_same<T, float>::value) {
    // The CPU backend on the same weights and inputs meets the same bound.
    const auto cpu = cpu_layer_forward(c, w, x, B, L, m.q_len, true);
    double diff = 0;
    for (std::size_t i = 0; i < cpu.size(); ++i) diff = std::fmax(diff, std::fabs(cpu[i] - got[i]));
    INFO("max |cuda - cpu| = " << diff);
    require_close<T>(cpu, ref, naive);
  }
}

/// Prefill prompts of different lengths, then 1-token steps, through a device KV cache;
/// every row must match the full causal reference.
template <class T>
void check_decode() {
  alibi::layer_config lc;
  lc.attention.embed_dim = 64;
  lc.attention.q_heads = 2;
  lc.attention.kv_heads = 1;
  lc.norm = alibi::norm_position::pre;
  alibi::transformer_layer<T, gpu> layer(lc, gpu{});
  const weight_map w = rounded<T>(random_weights(layer, 21));
  set_all(layer, w);
  const index_t B = 2, E = 64, L = 30;
  const std::vector<index_t> total = {30, 17}, prompt = {7, 1};
  const auto x = rounded<T>(randn(B * L * E, 8));
  mask_args m;
  m.causal = true;
  m.q_len = m.k_len = total;
  const auto ref = layer_ref<double>(layer.config(), w, cast_vector<double>(x), B, L, m);
  const auto naive = layer_ref<float>(layer.config(), w, x, B, L, m, round_to_element<T>{});
  auto cache = alibi::kv_cache<T, gpu>::for_module(layer, B, 32);
  std::vector<float> got(static_cast<std::size_t>(B * L * E), 0.0f);
  std::vector<index_t> done(2, 0);
  while (done != total) {
    std::vector<index_t> n(2);
    for (index_t b = 0; b < B; ++b)
      n[b] = std::min(done[b] == 0 ? prompt[b] : index_t{1}, total[b] - done[b]);
    const index_t width = std::max(n[0], n[1]);
    std::vector<float> in(static_cast<std::size_t>(B * width * E), 0.0f);
    for (index_t b = 0; b < B; ++b)
      std::copy_n(x.begin() + (b * L + done[b]) * E, n[b] * E, in.begin() + b * width * E);
    const device_rows<T> xd(in, B, width, E, n);
    device_out<T> out(B, width, E);
    alibi::forward_options opt;
    opt.mask.causal = true;
    opt.q_lengths = alibi::make_view<const index_t>(n.data(), B);
    layer.forward(xd.view(), out.view(), cache, opt);
    std::vector<float> step;
    REQUIRE(out.read(step));
    for (index_t b = 0; b < B; ++b) {
      std::copy_n(step.begin() + b * width * E, n[b] * E, got.begin() + (b * L + done[b]) * E);
      done[b] += n[b];
    }
  }
  require_close<T>(got, ref, naive);
}

}  // namespace

TEST_CASE("cuda layers: multi_head_attention matches the reference", "[cuda][layers]") {
  SECTION("float, self, causal, GQA, padding") { check_mha<float>(false); }
  SECTION("half, self, causal, GQA, padding") { check_mha<__half>(false); }
  SECTION("bfloat16, self, causal, GQA, padding") { check_mha<__nv_bfloat16>(false); }
  SECTION("float, cross, key_dim 48, key padding mask") { check_mha<float>(true); }
  SECTION("bfloat16, cross, key_dim 48, key padding mask") { check_mha<__nv_bfloat16>(true); }
}

TEST_CASE("cuda layers: transformer_layer matches the reference and the CPU", "[cuda][layers]") {
  alibi::layer_config post, pre;
  post.norm = alibi::norm_position::post;
  pre.norm = alibi::norm_position::pre;
  SECTION("float, post-norm") { check_layer<float>(post); }
  SECTION("float, pre-norm") { check_layer<float>(pre); }
  SECTION("bfloat16, post-norm") { check_layer<__nv_bfloat16>(post); }
  SECTION("half, pre-norm") { check_layer<__half>(pre); }
}

TEST_CASE("cuda layers: the model families' options (RMSNorm, gated SiLU, no norm bias)",
          "[cuda][layers]") {
  alibi::layer_config baichuan = alibi::families::baichuan(128, 4, 256, 1).layer;
  alibi::layer_config mpt = alibi::families::mpt(128, 4, 1).layer;
  alibi::layer_config falcon = alibi::families::falcon_rw(128, 4, 1).layer;
  SECTION("float, Baichuan-style") { check_layer<float>(baichuan); }
  SECTION("bfloat16, Baichuan-style") { check_layer<__nv_bfloat16>(baichuan); }
  SECTION("float, MPT-style") { check_layer<float>(mpt); }
  SECTION("half, Falcon-RW-style") { check_layer<__half>(falcon); }
}

TEST_CASE("cuda layers: prefill + decode steps equal the full causal forward",
          "[cuda][layers][sanitize]") {
  SECTION("float") { check_decode<float>(); }
  SECTION("bfloat16") { check_decode<__nv_bfloat16>(); }
}

TEST_CASE("cuda layers: unsupported head_dim is a clear error", "[cuda][layers]") {
  alibi::mha_config cfg;
  cfg.embed_dim = 80;
  cfg.q_heads = 2;  // head_dim 40: the CUDA kernel has 32, 64, 96, 128
  alibi::multi_head_attention<float, gpu> m(cfg, gpu{});
  device_rows<float> x(randn(1 * 4 * 80, 1), 1, 4, 80);
  device_out<float> out(1, 4, 80);
  REQUIRE_THROWS_WITH(m.forward(x.view(), out.view()), Catch::Contains("head_dim"));
  // Refused before anything changes: the cache keeps its length.
  auto cache = alibi::kv_cache<float, gpu>::for_module(m, 1, 8);
  REQUIRE_THROWS_WITH(m.forward(x.view(), out.view(), cache), Catch::Contains("head_dim"));
  REQUIRE(cache.length(0) == 0);
}
