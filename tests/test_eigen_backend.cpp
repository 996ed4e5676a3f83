// SPDX-License-Identifier: MIT
// The fused CPU backend against the double-precision oracle on the shared case list, plus
// thread-count independence and prefill-then-decode equivalence.
#include <vector>

#include <catch2/catch.hpp>

#include "backends.hpp"
#include "common.hpp"

using alibi::index_t;
using alibi_test::case_spec;

TEST_CASE("eigen backend matches the reference on the case grid", "[eigen][grid][heavy]") {
  for (const case_spec& spec : alibi_test::grid_cases()) {
    for (int threads : {1, 2}) {
      INFO(spec.name() << ", threads " << threads);
      const alibi_test::comparison r =
          alibi_test::check_backend(alibi::backend::eigen{threads}, spec);
      INFO(r.describe());
      CHECK(r.ok());
      // fp32 on unit-scale inputs: also within 1e-5 absolute.
      CHECK(r.max_err <= 1e-5);
    }
  }
}

TEST_CASE("eigen backend on large inputs, large slopes, custom scales", "[eigen][grid][heavy]") {
  std::vector<case_spec> cases = alibi_test::scale_cases();
  cases.push_back(alibi_test::value_dim_case());
  {
    case_spec c;  // v_head_dim 0: no output elements, but logsumexp is still computed
    c.lq = 30;
    c.lk = 200;
    c.d = 16;
    c.dv = 0;
    c.causal = true;
    cases.push_back(c);
  }
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    const alibi_test::comparison r = alibi_test::check_backend(alibi::backend::eigen{2}, spec);
    INFO(r.describe());
    CHECK(r.ok());
  }
}

TEST_CASE("eigen backend results do not depend on the thread count",
          "[eigen][determinism][heavy]") {
  std::vector<case_spec> cases(3);
  cases[0].batch = 2, cases[0].hq = 6, cases[0].hkv = 3, cases[0].lq = 300, cases[0].lk = 300,
  cases[0].causal = true;
  cases[1].batch = 1, cases[1].hq = 2, cases[1].hkv = 1, cases[1].lq = 3,
  cases[1].lk = 5000;  // split keys
  cases[2].batch = 3, cases[2].hq = 4, cases[2].hkv = 4, cases[2].lq = 129, cases[2].lk = 257,
  cases[2].lengths = true, cases[2].window_left = 40, cases[2].key_mask = true;
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    alibi_test::case_data c(spec);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3, 8}) {
      std::vector<float> out(static_cast<std::size_t>(spec.batch * spec.hq * spec.lq * spec.d));
      std::vector<float> lse(static_cast<std::size_t>(spec.batch * spec.hq * spec.lq));
      alibi::attention_params p = c.params;
      p.logsumexp = alibi::make_view(lse.data(), spec.batch, spec.hq, spec.lq);
      alibi::attention(alibi::backend::eigen{threads}, c.q.view, c.k.view, c.v.view,
                       alibi::make_view(out.data(), spec.batch, spec.hq, spec.lq, spec.d), p);
      out.insert(out.end(), lse.begin(), lse.end());
      outs.push_back(out);
    }
    for (std::size_t t = 1; t < outs.size(); ++t) CHECK(outs[t] == outs[0]);
  }
}

TEST_CASE("prefill then decode with position offsets equals the full causal computation",
          "[eigen][decode][heavy]") {
  // A 1 x 4-head (GQA 2) sequence of 700 tokens: the full causal result, then the same rows
  // computed as a 600-token prefill followed by single-token and 4-token decode steps that
  // see the cache [0, t) with query offsets t - q_len (the default bottom-right alignment).
  case_spec s;
  s.hq = 4;
  s.hkv = 2;
  s.lq = 700;
  s.lk = 700;
  s.d = 64;
  s.causal = true;
  alibi_test::case_data c(s);
  std::vector<float> full(static_cast<std::size_t>(4 * 700 * 64));
  const auto full_view = alibi::make_view(full.data(), 1, 4, 700, 64);
  const alibi::backend::eigen be{2};
  alibi::attention(be, c.q.view, c.k.view, c.v.view, full_view, c.params);
  std::vector<index_t> steps = {600, 1, 1, 4, 1, 16, 1, 76};
  index_t done = 0;
  for (index_t step : steps) {
    const index_t end = done + step;
    auto sub = [&](alibi::tensor_view<float, 4> v, index_t from, index_t len) {
      v.data = v.ptr(0, 0, from);
      v.extents[2] = len;
      return v;
    };
    std::vector<float> out(static_cast<std::size_t>(4 * step * 64));
    alibi::attention(be, sub(c.q.view, done, step), sub(c.k.view, 0, end), sub(c.v.view, 0, end),
                     alibi::make_view(out.data(), 1, 4, step, 64), c.params);
    double worst = 0;
    for (index_t h = 0; h < 4; ++h)
      for (index_t i = 0; i < step; ++i)
        for (index_t d = 0; d < 64; ++d)
          worst = std::max(
              worst,
              std::abs(static_cast<double>(out[static_cast<std::size_t>((h * step + i) * 64 + d)]) -
                       full_view(0, h, done + i, d)));
    INFO("decode step of " << step << " tokens at " << done);
    CHECK(worst <= 2e-6);
    done = end;
  }
  CHECK(done == 700);
}
