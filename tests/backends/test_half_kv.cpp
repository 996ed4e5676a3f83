// SPDX-License-Identifier: MIT
// K and V stored in fp16 or bf16 on the CPU backends: the eigen backend against the
// double-precision oracle computed from the same rounded values, the reference reading half
// precision exactly, thread-count independence, and the GQA grouping of small calls.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <Eigen/Core>
#include <alibi/backend/host/small_rows.hpp>
#include <catch2/catch.hpp>

#include "backends.hpp"
#include "common.hpp"
#include "stored_kv.hpp"

using alibi::index_t;
using alibi_test::case_data;
using alibi_test::case_spec;
using alibi_test::converted;
using alibi_test::padded_tensor;
using alibi_test::round_to;
using alibi_test::run_eigen;
using alibi_test::same_bits;

namespace {

/// The grid case with K/V rounded to T, stored as T (check_stored).
template <class T>
alibi_test::comparison check_half_storage(const case_spec& spec, int threads) {
  return alibi_test::check_stored<T>(
      spec, [&](const case_data& c, const alibi::attention_params& p, auto out) {
        const padded_tensor<T> kh = converted<T>(c.k, spec), vh = converted<T>(c.v, spec);
        alibi::attention(alibi::backend::eigen{threads}, c.q.view,
                         alibi::tensor_view<const T, 4>(kh.view),
                         alibi::tensor_view<const T, 4>(vh.view), out, p);
      });
}

}  // namespace

TEMPLATE_TEST_CASE("eigen backend with half-precision K/V matches the reference on the grid",
                   "[eigen][half][grid][heavy]", Eigen::half, Eigen::bfloat16) {
  std::vector<case_spec> cases = alibi_test::grid_cases();
  for (const case_spec& s : alibi_test::scale_cases()) cases.push_back(s);
  cases.push_back(alibi_test::value_dim_case());
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    const alibi_test::comparison r = check_half_storage<TestType>(spec, 2);
    INFO(r.describe());
    CHECK(r.ok());
  }
}

TEMPLATE_TEST_CASE("reference backend reads half-precision K/V exactly", "[reference][half]",
                   Eigen::half, Eigen::bfloat16) {
  case_spec spec;
  spec.batch = 2, spec.hq = 4, spec.hkv = 2, spec.lq = 9, spec.lk = 40, spec.d = 16;
  spec.causal = true, spec.key_mask = true;
  case_data c(spec);
  round_to<TestType>(c.k);
  round_to<TestType>(c.v);
  const padded_tensor<TestType> kh = converted<TestType>(c.k, spec);
  const padded_tensor<TestType> vh = converted<TestType>(c.v, spec);
  const alibi_test::oracle_result want = alibi_test::run_oracle(c);
  std::vector<double> got(want.out.size());
  alibi::attention(alibi::backend::reference{}, c.q.view,
                   alibi::tensor_view<const TestType, 4>(kh.view),
                   alibi::tensor_view<const TestType, 4>(vh.view),
                   alibi::make_view(got.data(), spec.batch, spec.hq, spec.lq, spec.d), c.params);
  CHECK(got == want.out);
}

TEMPLATE_TEST_CASE("half-precision K/V: results do not depend on the thread count",
                   "[eigen][half][determinism]", Eigen::half, Eigen::bfloat16) {
  std::vector<case_spec> cases(3);
  cases[0].batch = 2, cases[0].hq = 6, cases[0].hkv = 3, cases[0].lq = 300, cases[0].lk = 300,
  cases[0].causal = true;
  cases[1].batch = 1, cases[1].hq = 8, cases[1].hkv = 2, cases[1].lq = 1,
  cases[1].lk = 5000;  // a decode step with split keys
  cases[2].batch = 3, cases[2].hq = 4, cases[2].hkv = 1, cases[2].lq = 7, cases[2].lk = 257,
  cases[2].lengths = true, cases[2].window_left = 40, cases[2].key_mask = true;
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    case_data c(spec);
    const padded_tensor<TestType> kh = converted<TestType>(c.k, spec);
    const padded_tensor<TestType> vh = converted<TestType>(c.v, spec);
    const alibi::tensor_view<const TestType, 4> k(kh.view), v(vh.view);
    const alibi_test::out_lse one = run_eigen(c, k, v, 1);
    for (int threads : {2, 3, 8}) {
      const alibi_test::out_lse r = run_eigen(c, k, v, threads);
      CHECK(same_bits(r.out, one.out));
      CHECK(same_bits(r.lse, one.lse));
    }
  }
}

TEST_CASE("non-finite half-precision K/V values follow the contract like fp32",
          "[eigen][half][nonfinite]") {
  case_spec spec;
  spec.batch = 1, spec.hq = 4, spec.hkv = 2, spec.lq = 20, spec.lk = 300, spec.d = 32;
  spec.causal = true;
  case_data c(spec);
  round_to<Eigen::half>(c.k);
  round_to<Eigen::half>(c.v);
  const float inf = std::numeric_limits<float>::infinity();
  c.v.view(0, 0, 5, 3) = alibi_test::nan_f;  // reaches the rows that attend to key 5
  c.k.view(0, 1, 250, 0) = inf;              // an infinite score: NaN for rows that see it
  const padded_tensor<Eigen::half> kh = converted<Eigen::half>(c.k, spec);
  const padded_tensor<Eigen::half> vh = converted<Eigen::half>(c.v, spec);
  for (bool skip : {false, true}) {
    const alibi_test::out_lse half_run =
        run_eigen(c, alibi::tensor_view<const Eigen::half, 4>(kh.view),
                  alibi::tensor_view<const Eigen::half, 4>(vh.view), 2, skip);
    const alibi_test::out_lse fp32_run =
        run_eigen(c, alibi::tensor_view<const float, 4>(c.k.view),
                  alibi::tensor_view<const float, 4>(c.v.view), 2, skip);
    index_t nans = 0;
    for (std::size_t e = 0; e < fp32_run.out.size(); ++e) {
      INFO("element " << e);
      REQUIRE(std::isnan(half_run.out[e]) == std::isnan(fp32_run.out[e]));
      nans += std::isnan(fp32_run.out[e]) ? 1 : 0;
      if (!std::isnan(fp32_run.out[e])) CHECK(std::abs(half_run.out[e] - fp32_run.out[e]) <= 1e-5f);
    }
    // Rows before 5 never see key 5 (causal): finite; the others of head 0 see it: NaN.
    CHECK(nans > 0);
    CHECK(!std::isnan(fp32_run.out[0]));
  }
}

namespace {

/// t with the same logical values and its heads stored in the reverse order: the view starts
/// at the last head's memory and its head stride is negated.
template <class T>
void reverse_heads(padded_tensor<T>& t) {
  std::vector<T> buf(t.buf.size(), t.fill);
  alibi::tensor_view<T, 4> to = t.view;
  to.data = buf.data() + (t.view.data - t.buf.data()) + (t.view.extents[1] - 1) * t.view.strides[1];
  to.strides[1] = -t.view.strides[1];
  t.for_each([&](T x, index_t b, index_t h, index_t i, index_t e) { to(b, h, i, e) = x; });
  t.buf = std::move(buf);
  t.view = to;
}

}  // namespace

TEMPLATE_TEST_CASE(
    "K/V with the tokens outermost, every KV head of a small call together: the oracle, any "
    "thread count",
    "[eigen][half][layout]", float, Eigen::half, Eigen::bfloat16) {
  // A small call over a (batch, seq, heads, dim) cache of at least 4096 keys with skipping
  // off takes all the query heads of a batch entry together (work_plan::all_kv_heads), in
  // blocks of keys of all KV heads (small_tile_kv_heads). GQA and MHA, masks and lengths,
  // the most rows a small call has (16) with a head dim of no whole packet count (42: a
  // scalar tail with any packet width), and
  // the heads stored in reverse order (a negative head stride).
  std::vector<case_spec> cases(4);
  cases[0].hq = 8, cases[0].hkv = 2, cases[0].lq = 1, cases[0].lk = 4500, cases[0].d = 64;
  cases[1].batch = 3, cases[1].hq = 4, cases[1].hkv = 4, cases[1].lq = 3, cases[1].lk = 5000;
  cases[1].d = 128, cases[1].causal = true, cases[1].lengths = true, cases[1].key_mask = true;
  cases[2].hq = 6, cases[2].hkv = 3, cases[2].lq = 16, cases[2].lk = 4200, cases[2].d = 42;
  cases[2].causal = true, cases[2].window_left = 3000;
  cases[3] = cases[0];
  cases[3].seed = 7;  // reversed heads
  for (std::size_t n = 0; n < cases.size(); ++n) {
    case_spec spec = cases[n];
    spec.bshd = true;
    const bool reversed = n == 3;
    INFO(spec.name() << (reversed ? " heads reversed" : ""));
    std::vector<float> first;
    for (int threads : {1, 2}) {
      std::vector<float> got;
      const alibi_test::comparison r = alibi_test::check_stored<TestType>(
          spec, [&](const case_data& c, const alibi::attention_params& p, auto out) {
            alibi::attention_params dense = p;
            dense.skip_far_tiles = false;
            padded_tensor<TestType> kh = converted<TestType>(c.k, spec),
                                    vh = converted<TestType>(c.v, spec);
            if (reversed) {
              reverse_heads(kh);
              reverse_heads(vh);
            }
            alibi::attention(alibi::backend::eigen{threads}, c.q.view,
                             alibi::tensor_view<const TestType, 4>(kh.view),
                             alibi::tensor_view<const TestType, 4>(vh.view), out, dense);
            for (index_t b = 0; b < spec.batch; ++b)
              for (index_t h = 0; h < spec.hq; ++h)
                for (index_t i = 0; i < spec.lq; ++i)
                  for (index_t e = 0; e < spec.d; ++e) got.push_back(out(b, h, i, e));
          });
      INFO("threads " << threads << ": " << r.describe());
      CHECK(r.ok());
      if (first.empty())
        first = got;
      else
        CHECK(same_bits(got, first));
    }
  }
}

TEMPLATE_TEST_CASE(
    "K/V with the tokens outermost, every KV head together: a non-finite V row reaches only "
    "the rows that attend to it",
    "[eigen][half][layout][nonfinite]", float, Eigen::half) {
  // A NaN in one V row of KV head 0: NaN in that element of the rows of its query heads
  // (0 and 1), nothing else; the same as with the heads outermost (which takes one KV head
  // at a time).
  case_spec spec;
  spec.hq = 4, spec.hkv = 2, spec.lq = 2, spec.lk = 4300, spec.d = 32, spec.bshd = true;
  case_spec by_heads = spec;
  by_heads.bshd = false;
  case_data c(spec), h(by_heads);  // the same values, drawn in (b, h, i, e) order
  for (case_data* x : {&c, &h}) {
    round_to<TestType>(x->k);
    round_to<TestType>(x->v);
    x->v.view(0, 0, 3000, 5) = alibi_test::nan_f;
  }
  const padded_tensor<TestType> kc = converted<TestType>(c.k, spec),
                                vc = converted<TestType>(c.v, spec);
  const padded_tensor<TestType> kh = converted<TestType>(h.k, by_heads),
                                vh = converted<TestType>(h.v, by_heads);
  const alibi_test::out_lse tokens =
      run_eigen(c, alibi::tensor_view<const TestType, 4>(kc.view),
                alibi::tensor_view<const TestType, 4>(vc.view), 2, false);
  const alibi_test::out_lse heads =
      run_eigen(h, alibi::tensor_view<const TestType, 4>(kh.view),
                alibi::tensor_view<const TestType, 4>(vh.view), 2, false);
  for (index_t hq = 0; hq < spec.hq; ++hq)
    for (index_t i = 0; i < spec.lq; ++i)
      for (index_t e = 0; e < spec.d; ++e) {
        const auto at = static_cast<std::size_t>((hq * spec.lq + i) * spec.d + e);
        INFO("head " << hq << " row " << i << " element " << e);
        CHECK(std::isnan(tokens.out[at]) == (hq < 2 && e == 5));
        CHECK(std::isnan(heads.out[at]) == (hq < 2 && e == 5));
        if (!std::isnan(heads.out[at])) CHECK(std::abs(tokens.out[at] - heads.out[at]) <= 1e-5f);
      }
  for (std::size_t r = 0; r < tokens.lse.size(); ++r)
    CHECK(std::abs(tokens.lse[r] - heads.lse[r]) <= 1e-5f);
}

TEMPLATE_TEST_CASE(
    "far-tile skipping with the key norms computed by the call: the tokens outermost give the "
    "bits and tile counts of the heads outermost",
    "[eigen][half][layout][skip]", float, Eigen::half) {
  // With K's heads interleaved the call sums the key norms a key tile at a time for every
  // KV head (compute_key_norms); the norms, hence the bounds, the tiles skipped and the
  // results, are those of a pass one KV head at a time over the same values.
  std::vector<case_spec> cases(2);
  cases[0].hq = 8, cases[0].hkv = 2, cases[0].lq = 1, cases[0].lk = 6000, cases[0].d = 64;
  cases[0].causal = true;
  cases[1].batch = 2, cases[1].hq = 4, cases[1].hkv = 4, cases[1].lq = 40, cases[1].lk = 3000;
  cases[1].d = 32, cases[1].causal = true, cases[1].key_mask = true, cases[1].lengths = true;
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    std::vector<alibi_test::out_lse> runs;
    std::vector<alibi::attention_stats> stats;
    for (bool bshd : {false, true}) {
      case_spec s = spec;
      s.bshd = bshd;
      case_data c(s);  // the same values either way, drawn in (b, h, i, e) order
      round_to<TestType>(c.k);
      round_to<TestType>(c.v);
      alibi::attention_stats st;
      c.params.stats = &st;
      const padded_tensor<TestType> kh = converted<TestType>(c.k, s),
                                    vh = converted<TestType>(c.v, s);
      runs.push_back(run_eigen(c, alibi::tensor_view<const TestType, 4>(kh.view),
                               alibi::tensor_view<const TestType, 4>(vh.view), 2, true));
      stats.push_back(st);
    }
    CHECK(stats[0].tiles_skipped > 0);
    CHECK(stats[1].tiles_skipped == stats[0].tiles_skipped);
    CHECK(stats[1].tiles_computed == stats[0].tiles_computed);
    CHECK(same_bits(runs[1].out, runs[0].out));
    CHECK(same_bits(runs[1].lse, runs[0].lse));
  }
}

TEST_CASE("small calls: a GQA group sharing K/V tiles equals the heads computed alone",
          "[eigen][gqa]") {
  // A GQA problem against the same problem with K/V copied to every query head (groups of
  // one). Each query head sees the same tiles in the same order either way, so the results
  // are bitwise equal where the key split is the same (k_len below 2 * 2048: no split); with
  // a longer cache the split differs and the grid tests cover them under the tolerance rule.
  for (index_t lq : {1, 5, 16}) {
    for (bool skip : {false, true}) {
      case_spec spec;
      spec.batch = 3, spec.hq = 8, spec.hkv = 2, spec.lq = lq, spec.lk = 2000, spec.d = 64;
      spec.causal = true, spec.lengths = true, spec.key_mask = lq == 5, spec.offsets = lq == 16;
      INFO(spec.name() << (skip ? ", skipping" : ""));
      case_data c(spec);
      const case_data d = alibi_test::per_head_copy(c);
      const alibi_test::out_lse grouped =
          run_eigen(c, alibi::tensor_view<const float, 4>(c.k.view),
                    alibi::tensor_view<const float, 4>(c.v.view), 2, skip);
      const alibi_test::out_lse alone =
          run_eigen(c, alibi::tensor_view<const float, 4>(d.k.view),
                    alibi::tensor_view<const float, 4>(d.v.view), 2, skip);
      CHECK(same_bits(grouped.out, alone.out));
      CHECK(same_bits(grouped.lse, alone.lse));
    }
  }
}

TEMPLATE_TEST_CASE("small-row products: a row's results do not depend on the rows beside it",
                   "[eigen][half][small_rows]", float, Eigen::half, Eigen::bfloat16) {
  // The decode products (backend/eigen/small_rows.hpp) on 7 rows at once (Q K^T: with fp32
  // K and 8 whole packets a block of 4 rows, then pairs of rows with their packets in
  // registers where the head dim has 4 or 8 whole packets, else blocks of 4 and 2; then 1; P V:
  // blocks of 4, 2 and 1; lane sums share reduction trees) against each row alone, bitwise; and
  // against a double-precision dot product / weighted sum of the same stored values. Head
  // dims with and without a tail beyond whole packets; the P V keys skip two listed keys.
  namespace cpu = alibi::detail::cpu;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (index_t d : {7, 64, 72, 128, 136}) {
    INFO("d = " << d);
    const index_t m = 7, bk = 37, ld = d + 3;
    std::vector<float> q(static_cast<std::size_t>(m * d)), p(static_cast<std::size_t>(m * bk));
    std::vector<TestType> k(static_cast<std::size_t>(bk * ld)), v(k.size());
    for (float& x : q) x = nd(gen);
    for (float& x : p) x = std::abs(nd(gen));
    for (std::size_t e = 0; e < k.size(); ++e) {
      k[e] = static_cast<TestType>(nd(gen));
      v[e] = static_cast<TestType>(nd(gen));
    }
    const std::vector<index_t> skip = {3, 20};
    auto none = [] {};
    std::vector<float> s_all(static_cast<std::size_t>(m * bk)), s_one(s_all.size());
    std::vector<float> o_all(static_cast<std::size_t>(m * d), 0.5f), o_one(o_all);
    std::vector<const float*> qr, pr;
    std::vector<float*> sr, orow;
    for (index_t t = 0; t < m; ++t) {
      qr.push_back(q.data() + t * d);
      pr.push_back(p.data() + t * bk);
      sr.push_back(s_all.data() + t * bk);
      orow.push_back(o_all.data() + t * d);
    }
    cpu::small_scores(qr.data(), m, k.data(), ld, bk, d, sr.data(), none);
    cpu::small_pv(pr.data(), m, v.data(), ld, bk, d, skip.data(), 2, orow.data(), none);
    for (index_t t = 0; t < m; ++t) {
      float* s1 = s_one.data() + t * bk;
      float* o1 = o_one.data() + t * d;
      cpu::small_scores(qr.data() + t, 1, k.data(), ld, bk, d, &s1, none);
      cpu::small_pv(pr.data() + t, 1, v.data(), ld, bk, d, skip.data(), 2, &o1, none);
    }
    CHECK(same_bits(s_all, s_one));
    CHECK(same_bits(o_all, o_one));
    double worst_s = 0, worst_o = 0;
    for (index_t t = 0; t < m; ++t) {
      for (index_t j = 0; j < bk; ++j) {
        double dot = 0, mag = 0;
        for (index_t e = 0; e < d; ++e) {
          const double x = q[t * d + e] * static_cast<double>(static_cast<float>(k[j * ld + e]));
          dot += x;
          mag += std::abs(x);
        }
        worst_s = std::max(worst_s, std::abs(s_all[t * bk + j] - dot) / mag);
      }
      for (index_t e = 0; e < d; ++e) {
        double acc = 0.5, mag = 0.5;
        for (index_t j = 0; j < bk; ++j) {
          if (j == 3 || j == 20) continue;
          const double x = p[t * bk + j] * static_cast<double>(static_cast<float>(v[j * ld + e]));
          acc += x;
          mag += std::abs(x);
        }
        worst_o = std::max(worst_o, std::abs(o_all[t * d + e] - acc) / mag);
      }
    }
    // The forward error bound of a float sum of n products in any order, relative to the sum
    // of their magnitudes: gamma_n = n u / (1 - n u) with u = 2^-24 (the stored values are
    // exact floats, the products exact in double).
    const double u = std::ldexp(1.0, -24);
    auto gamma = [&](double n) { return n * u / (1 - n * u); };
    CHECK(worst_s <= gamma(static_cast<double>(d)));
    CHECK(worst_o <= gamma(static_cast<double>(bk + 1)));
  }
}
