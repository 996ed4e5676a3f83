// SPDX-License-Identifier: MIT
// alibi::kernels' dispatcher: the variant it runs (the one ALIBI_CPU_KERNELS names, or the
// best the CPU supports) gives the forward (float, fp16 and bf16 K/V), the merge and the
// backward within 1e-5 of the double-precision reference for unit-normal inputs. With
// ALIBI_DISPATCH_EXPECT set, the variant that ran must be that one; a variant this CPU cannot
// run is reported as skipped (ctest's SKIP_REGULAR_EXPRESSION).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <Eigen/Core>

#include <alibi/backend/eigen/attention.hpp>
#include <alibi/backend/eigen/attention_backward.hpp>
#include <alibi/backend/reference/attention.hpp>
#include <alibi/backend/reference/attention_backward.hpp>

#if !defined(ALIBI_PRECOMPILED_KERNELS)
#error "this file must be compiled against alibi::kernels"
#endif

namespace {

using alibi::index_t;

template <class T, class U>
double max_abs_diff(const std::vector<T>& a, const std::vector<U>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::fmax(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return worst;
}

// One shape: every call through the selected variant against the reference. Returns the
// largest error.
double check(index_t B, index_t Hq, index_t Hkv, index_t Lq, index_t Lk, index_t D, bool causal,
             int threads) {
  std::mt19937 rng(29);
  std::normal_distribution<float> randn;
  auto filled = [&](index_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = randn(rng);
    return x;
  };
  const std::vector<float> q = filled(B * Hq * Lq * D), k = filled(B * Hkv * Lk * D),
                           v = filled(B * Hkv * Lk * D), dout = filled(B * Hq * Lq * D);
  const std::vector<Eigen::half> k16(k.begin(), k.end()), v16(v.begin(), v.end());
  const std::vector<Eigen::bfloat16> kb(k.begin(), k.end()), vb(v.begin(), v.end());
  auto as_double = [](const auto& x) {
    std::vector<double> d(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) d[i] = static_cast<double>(static_cast<float>(x[i]));
    return d;
  };
  const std::vector<double> qd = as_double(q), dd = as_double(dout);
  const auto n_out = static_cast<std::size_t>(B * Hq * Lq * D);
  const auto n_kv = static_cast<std::size_t>(B * Hkv * Lk * D);
  const auto n_rows = static_cast<std::size_t>(B * Hq * Lq);
  alibi::attention_params p;
  p.mask.causal = causal;
  const alibi::backend::eigen be{threads};
  const alibi::backend::reference ref{};
  auto q4 = [&](auto* x) { return alibi::make_view(x, B, Hq, Lq, D); };
  auto kv4 = [&](auto* x) { return alibi::make_view(x, B, Hkv, Lk, D); };
  double worst = 0;

  // The forward for each K/V type, against the reference on the same (rounded) K/V values.
  auto forward = [&](const auto& kk, const auto& vv, const char* what) {
    std::vector<float> out(n_out), lse(n_rows);
    std::vector<double> out_ref(n_out);
    const std::vector<double> kd = as_double(kk), vd = as_double(vv);
    alibi::attention_params pl = p;
    pl.logsumexp = alibi::make_view(lse.data(), B, Hq, Lq);
    alibi::attention(be, q4(q.data()), kv4(kk.data()), kv4(vv.data()), q4(out.data()), pl);
    alibi::attention(ref, q4(qd.data()), kv4(kd.data()), kv4(vd.data()), q4(out_ref.data()), p);
    const double e = max_abs_diff(out, out_ref);
    std::printf("  forward, %s K/V: max |eigen - reference| %.2e\n", what, e);
    worst = std::fmax(worst, e);
    return std::make_pair(out, lse);
  };
  const auto f32 = forward(k, v, "float");
  forward(k16, v16, "fp16");
  forward(kb, vb, "bf16");

  // The merge of the two key halves equals the whole call.
  if (!causal && Lk >= 2) {
    const index_t h0 = Lk / 2;
    std::vector<float> part_a(n_out), part_b(n_out), lse_a(n_rows), lse_b(n_rows), merged(n_out);
    const std::vector<index_t> offset_b(static_cast<std::size_t>(B), h0),
        q_offset(static_cast<std::size_t>(B), Lk - Lq);
    auto half_call = [&](index_t k0, index_t len, std::vector<float>& out, std::vector<float>& lse,
                         const std::vector<index_t>* offsets) {
      alibi::attention_params hp = p;
      hp.logsumexp = alibi::make_view(lse.data(), B, Hq, Lq);
      hp.q_offsets = alibi::make_view<const index_t>(q_offset.data(), B);
      if (offsets) hp.k_offsets = alibi::make_view<const index_t>(offsets->data(), B);
      const auto kh = alibi::make_strided_view<const float, 4>(k.data() + k0 * D, {B, Hkv, len, D},
                                                               {Hkv * Lk * D, Lk * D, D, 1});
      const auto vh = alibi::make_strided_view<const float, 4>(v.data() + k0 * D, {B, Hkv, len, D},
                                                               {Hkv * Lk * D, Lk * D, D, 1});
      alibi::attention(be, q4(q.data()), kh, vh, q4(out.data()), hp);
    };
    half_call(0, h0, part_a, lse_a, nullptr);
    half_call(h0, Lk - h0, part_b, lse_b, &offset_b);
    alibi::merge_partials(be, alibi::make_view<const float>(part_a.data(), B, Hq, Lq, D),
                          alibi::make_view<const float>(lse_a.data(), B, Hq, Lq),
                          alibi::make_view<const float>(part_b.data(), B, Hq, Lq, D),
                          alibi::make_view<const float>(lse_b.data(), B, Hq, Lq),
                          q4(merged.data()));
    const double e = max_abs_diff(merged, f32.first);
    std::printf("  merge of the key halves: max |merged - whole call| %.2e\n", e);
    worst = std::fmax(worst, e);
  }

  // The backward, against the reference's in double from the same forward.
  std::vector<float> dq(n_out), dk(n_kv), dv(n_kv);
  std::vector<double> dq_ref(n_out), dk_ref(n_kv), dv_ref(n_kv);
  const std::vector<double> kd = as_double(k), vd = as_double(v), outd = as_double(f32.first);
  std::vector<float> lse = f32.second;
  alibi::attention_params pb = p;
  pb.logsumexp = alibi::make_view(lse.data(), B, Hq, Lq);
  alibi::attention_backward(
      be, q4(q.data()), kv4(k.data()), kv4(v.data()), q4(f32.first.data()), q4(dout.data()), pb,
      alibi::attention_gradients<float>{q4(dq.data()), kv4(dk.data()), kv4(dv.data())});
  alibi::attention_backward(ref, q4(qd.data()), kv4(kd.data()), kv4(vd.data()), q4(outd.data()),
                            q4(dd.data()), pb,
                            alibi::attention_gradients<double>{
                                q4(dq_ref.data()), kv4(dk_ref.data()), kv4(dv_ref.data())});
  const double eb = std::fmax(max_abs_diff(dq, dq_ref),
                              std::fmax(max_abs_diff(dk, dk_ref), max_abs_diff(dv, dv_ref)));
  std::printf("  backward: max |eigen - reference| over dq, dk, dv %.2e\n", eb);
  return std::fmax(worst, eb);
}

}  // namespace

int main() {
  const char* expect = std::getenv("ALIBI_DISPATCH_EXPECT");
  std::string built;
  bool expect_supported = expect == nullptr;
  for (const alibi::cpu_kernels_variant& v : alibi::cpu_kernels_variants()) {
    built += std::string(built.empty() ? "" : ", ") + v.name + " (" + v.isa +
             (v.supported ? ")" : ", not on this CPU)");
    if (expect != nullptr && std::strcmp(expect, v.name) == 0) expect_supported = v.supported;
  }
  std::printf("alibi::kernels variants: %s\n", built.c_str());
  if (!expect_supported) {
    std::printf("SKIPPED: this CPU cannot run %s\n", expect);
    return 0;
  }
  alibi::cpu_kernels_variant ran{};
  try {
    ran = alibi::cpu_kernels_selected();
  } catch (const alibi::error& e) {
    std::printf("alibi::error: %s\n", e.what());
    return 1;
  }
  std::printf("variant that runs: %s (%s)\n", ran.name, ran.isa);
  if (expect != nullptr && std::strcmp(expect, ran.name) != 0) {
    std::printf("expected %s: FAILED\n", expect);
    return 1;
  }
  // Prefill with GQA, decoding over many keys, a causal odd-sized block on several threads.
  double worst = 0;
  try {
    worst = std::fmax(worst, check(2, 4, 2, 37, 37, 32, false, 2));
    worst = std::fmax(worst, check(1, 4, 1, 1, 700, 64, false, 1));
    worst = std::fmax(worst, check(1, 2, 2, 130, 130, 16, true, 3));
  } catch (const alibi::error& e) {  // e.g. a bad ALIBI_POOL_SPIN_US, at the first parallel call
    std::printf("alibi::error: %s\n", e.what());
    return 1;
  }
  const bool ok = worst < 1e-5;
  std::printf("dispatch (%s): max error %.2e: %s\n", ran.name, worst, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
