// SPDX-License-Identifier: MIT
// The README's usage example: causal ALiBi attention over a (batch, seq, heads, dim) buffer.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <alibi/alibi.hpp>

int main() {
  const alibi::index_t batch = 2, seq = 256, heads = 8, head_dim = 64;
  std::vector<float> q(batch * seq * heads * head_dim), k(q.size()), v(q.size()), out(q.size());
  std::mt19937 rng(0);
  std::normal_distribution<float> randn;
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = randn(rng);

  // Views of (batch, seq, heads, dim) memory, e.g. straight from a QKV projection.
  auto qv = alibi::view_bshd(q.data(), batch, seq, heads, head_dim);
  auto kv = alibi::view_bshd(k.data(), batch, seq, heads, head_dim);
  auto vv = alibi::view_bshd(v.data(), batch, seq, heads, head_dim);
  auto ov = alibi::view_bshd(out.data(), batch, seq, heads, head_dim);

  alibi::attention_params params;  // slopes of an 8-head model, scale 1/sqrt(64)
  params.mask.causal = true;
  alibi::attention(alibi::backend::eigen{2}, qv, kv, vv, ov, params);

  // Check one row against the double-precision reference backend.
  std::vector<double> ref(out.size());
  auto rv =
      alibi::make_strided_view<double, 4>(ref.data(), {batch, heads, seq, head_dim},
                                          {seq * heads * head_dim, head_dim, heads * head_dim, 1});
  alibi::attention(alibi::backend::reference{}, qv, kv, vv, rv, params);
  double worst = 0;
  for (std::size_t i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out[i] - ref[i]));
  std::printf(
      "quickstart: causal ALiBi attention, batch %lld, seq %lld, %lld heads, head_dim %lld\n",
      static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
      static_cast<long long>(head_dim));
  std::printf("out[batch 1, head 0, row 255, 0:4] = %.5f %.5f %.5f %.5f\n", ov(1, 0, 255, 0),
              ov(1, 0, 255, 1), ov(1, 0, 255, 2), ov(1, 0, 255, 3));
  std::printf("max |fused - reference| = %.2e\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
