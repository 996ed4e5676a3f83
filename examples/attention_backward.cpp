// SPDX-License-Identifier: MIT
// The README's backward-pass example: a causal ALiBi attention forward that keeps its
// logsumexp, then the gradients of a loss with respect to q, k, v and the slopes, checked
// against the double-precision reference backend.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <alibi/alibi.hpp>

int main() {
  const alibi::index_t batch = 2, seq = 300, heads = 8, kv_heads = 2, head_dim = 64;
  const auto n_q = static_cast<std::size_t>(batch * seq * heads * head_dim);
  const auto n_kv = static_cast<std::size_t>(batch * seq * kv_heads * head_dim);
  std::vector<float> q(n_q), k(n_kv), v(n_kv), out(n_q), dout(n_q);
  std::vector<float> slopes = alibi::slopes(heads);  // trainable here: d loss / d slope below
  std::mt19937 rng(0);
  std::normal_distribution<float> randn;
  for (auto* t : {&q, &k, &v, &dout})
    for (float& x : *t) x = randn(rng);

  // (batch, seq, heads, dim) memory; grouped-query attention (8 query heads on 2 kv heads).
  auto qv = alibi::view_bshd(q.data(), batch, seq, heads, head_dim);
  auto kv = alibi::view_bshd(k.data(), batch, seq, kv_heads, head_dim);
  auto vv = alibi::view_bshd(v.data(), batch, seq, kv_heads, head_dim);
  auto ov = alibi::view_bshd(out.data(), batch, seq, heads, head_dim);
  auto dov = alibi::view_bshd(dout.data(), batch, seq, heads, head_dim);  // d loss / d out

  // The forward keeps the logsumexp, which the backward needs.
  std::vector<float> lse(static_cast<std::size_t>(batch * heads * seq));
  alibi::attention_params params;
  params.mask.causal = true;
  params.slopes = alibi::slope_config::per_head(slopes.data(), heads);
  params.logsumexp = alibi::make_view(lse.data(), batch, heads, seq);
  const alibi::backend::eigen cpu{2};
  alibi::attention(cpu, qv, kv, vv, ov, params);

  // Gradients: dk and dv sum over the query heads of each group; dslopes per head (one row:
  // summed over the batch).
  std::vector<float> dq(n_q), dk(n_kv), dv(n_kv), dslopes(static_cast<std::size_t>(heads));
  auto dqv = alibi::view_bshd(dq.data(), batch, seq, heads, head_dim);
  auto dkv = alibi::view_bshd(dk.data(), batch, seq, kv_heads, head_dim);
  auto dvv = alibi::view_bshd(dv.data(), batch, seq, kv_heads, head_dim);
  auto dsv = alibi::make_view(dslopes.data(), 1, heads);
  // params.logsumexp, written by the forward, is read here: pass the forward's params.
  alibi::attention_backward(cpu, qv, kv, vv, ov, dov, params,
                            alibi::attention_gradients<float>{dqv, dkv, dvv, dsv});

  // The same gradients from the reference backend (double), for comparison.
  std::vector<double> rq(n_q), rk(n_kv), rv(n_kv);
  std::vector<float> rs(static_cast<std::size_t>(heads));
  alibi::attention_gradients<double> ref;
  ref.dq = alibi::view_bshd(rq.data(), batch, seq, heads, head_dim);
  ref.dk = alibi::view_bshd(rk.data(), batch, seq, kv_heads, head_dim);
  ref.dv = alibi::view_bshd(rv.data(), batch, seq, kv_heads, head_dim);
  ref.dslopes = alibi::make_view(rs.data(), 1, heads);
  alibi::attention_backward(alibi::backend::reference{}, qv, kv, vv, ov, dov, params, ref);
  auto worst = [](const std::vector<float>& a, const std::vector<double>& b) {
    double w = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      w = std::fmax(w, std::fabs(a[i] - b[i]));
      scale = std::fmax(scale, std::fabs(b[i]));
    }
    return w / scale;
  };
  const double eq = worst(dq, rq), ek = worst(dk, rk), ev = worst(dv, rv);
  double es = 0, ss = 0;
  for (alibi::index_t h = 0; h < heads; ++h) {
    es = std::fmax(
        es, std::fabs(dslopes[static_cast<std::size_t>(h)] - rs[static_cast<std::size_t>(h)]));
    ss = std::fmax(ss, std::fabs(rs[static_cast<std::size_t>(h)]));
  }
  std::printf(
      "attention_backward: causal, batch %lld, seq %lld, %lld query heads on %lld kv heads, "
      "head_dim %lld\n",
      static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(heads),
      static_cast<long long>(kv_heads), static_cast<long long>(head_dim));
  std::printf("d loss / d slope (heads 0..3): %.4f %.4f %.4f %.4f\n", dslopes[0], dslopes[1],
              dslopes[2], dslopes[3]);
  std::printf(
      "eigen vs reference, max error relative to the gradient's scale: dq %.1e, dk %.1e, dv %.1e, "
      "dslopes %.1e\n",
      eq, ek, ev, es / ss);
  const bool ok = eq < 1e-5 && ek < 1e-5 && ev < 1e-5 && es / ss < 1e-5;
  std::printf("%s\n", ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
