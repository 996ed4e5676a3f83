// SPDX-License-Identifier: MIT
// The fused CPU backend against the double-precision oracle on the shared case list, plus
// thread-count independence and prefill-then-decode equivalence.
#include <cstring>
#include <initializer_list>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/backend/eigen/attention_kernel.hpp>

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

namespace {

/// Each case with K/V stored with the tokens outermost ((batch, seq, heads, dim) memory), head
/// dim d, skipping off, against the oracle, on every thread count of `threads`, each result
/// bitwise that of the first; case i draws its values from seed + i.
void check_tokens_outermost(std::vector<case_spec> cases, index_t d, std::uint64_t seed,
                            std::initializer_list<int> threads) {
  for (std::size_t i = 0; i < cases.size(); ++i) {
    case_spec& spec = cases[i];
    spec.d = d, spec.bshd = true, spec.seed = seed + i;
    INFO(spec.name());
    alibi_test::case_data c(spec);
    c.params.skip_far_tiles = false;
    std::vector<float> first;
    for (int n : threads) {
      INFO("threads " << n);
      alibi_test::padded_tensor<float> out(spec.batch, spec.hq, spec.lq, spec.d, true, 1234.5f);
      const alibi_test::comparison r = alibi_test::check_call(
          c, [&](const alibi_test::case_data& x, const alibi::attention_params& p,
                 const alibi::tensor_view<float, 4>& o) {
            alibi::attention(alibi::backend::eigen{n}, x.q.view, x.k.view, x.v.view, o, p);
            alibi::attention(alibi::backend::eigen{n}, x.q.view, x.k.view, x.v.view, out.view, p);
          });
      INFO(r.describe());
      CHECK(r.ok());
      CHECK(r.max_err <= 1e-5);
      if (first.empty())
        first = out.buf;
      else
        CHECK(std::memcmp(first.data(), out.buf.data(), first.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("small calls over KV heads that interleave in memory: the oracle, any thread count",
          "[eigen][decode][layout]") {
  // At least 2 * 2048 keys and skipping off: a small call then works in key chunks, chunk
  // by chunk (work_plan; 2048 keys with these short token rows). Uneven last chunks, GQA
  // and MHA, masks and lengths; 16 units (which otherwise take no split); 36865 keys (18
  // splits of 2049 keys, rounded up to whole tiles: 2176, recounted to 17 chunks so that
  // none starts past the last key).
  std::vector<case_spec> cases(4);
  cases[0].batch = 2, cases[0].hq = 4, cases[0].hkv = 2, cases[0].lq = 3, cases[0].lk = 4096;
  cases[0].causal = true;
  cases[1].batch = 2, cases[1].hq = 4, cases[1].hkv = 4, cases[1].lq = 1, cases[1].lk = 6001;
  cases[1].lengths = true, cases[1].key_mask = true;
  cases[2].batch = 2, cases[2].hq = 8, cases[2].hkv = 8, cases[2].lq = 1, cases[2].lk = 4096;
  cases[3].batch = 1, cases[3].hq = 4, cases[3].hkv = 2, cases[3].lq = 2, cases[3].lk = 36865;
  cases[3].causal = true;
  check_tokens_outermost(cases, 32, 40, {1, 2, 3});
}

TEST_CASE(
    "small calls over interleaved KV heads with long token rows: the oracle, any thread "
    "count",
    "[eigen][decode][layout][heavy]") {
  // 8 and 16 KV heads of 128 fp32 elements (rows padded to 133): 4256 and 8512 bytes from
  // one token's row of a head to the next, so the key chunks are about 985 and 492 keys
  // (work_plan: 4 chunks of 1024, and with 5140 keys 9 chunks of 640, the last of 20), not
  // the 2048 of the test above.
  std::vector<case_spec> cases(2);
  cases[0].batch = 1, cases[0].hq = 16, cases[0].hkv = 8, cases[0].lq = 1, cases[0].lk = 4096;
  cases[1].batch = 1, cases[1].hq = 16, cases[1].hkv = 16, cases[1].lq = 2, cases[1].lk = 5140;
  cases[1].causal = true, cases[1].key_mask = true;
  check_tokens_outermost(cases, 128, 50, {1, 2});
}

TEST_CASE("the key chunks of small calls over interleaved KV heads follow the token stride",
          "[eigen][layout]") {
  // About interleaved_chunk_bytes (4 MiB) of each head's rows per chunk, 256 to 2048 keys,
  // whole tiles; only with interleaved heads, skipping off and at least 4096 keys.
  using plan = alibi::detail::cpu::work_plan;
  alibi::detail::attention_problem p;
  p.batch = 1, p.q_heads = 32, p.kv_heads = 32, p.q_len = 1, p.k_len = 32768;
  p.head_dim = p.v_head_dim = 128;
  const plan fp32_mha = plan::make(p, 32 * 128 * 4, false);  // 16 KiB: 256 keys
  CHECK(fp32_mha.chunk_major);
  CHECK(fp32_mha.chunk == 256);
  CHECK(fp32_mha.splits == 128);
  const plan fp16_mha = plan::make(p, 32 * 128 * 2, false);  // 8 KiB: 512 keys
  CHECK(fp16_mha.chunk == 512);
  const plan tiny = plan::make(p, 1 << 20, false);  // beyond 4 MiB per 256 keys: 256
  CHECK(tiny.chunk == 256);
  CHECK(plan::make(p, 256, false).chunk == 2048);  // short rows: at most 2048 keys
  CHECK_FALSE(plan::make(p, 0, false).chunk_major);
  CHECK_FALSE(plan::make(p, 32 * 128 * 4, true).chunk_major);
  p.kv_heads = 8;
  const plan fp32_gqa = plan::make(p, 8 * 128 * 4, false);  // 4 KiB: 1024 keys
  CHECK(fp32_gqa.chunk == 1024);
  CHECK(fp32_gqa.splits == 32);
  p.k_len = 4500;  // 4 chunks of about 1024 keys: 1152 (whole tiles), the last of 1044
  const plan uneven = plan::make(p, 8 * 128 * 4, false);
  CHECK(uneven.chunk == 1152);
  CHECK(uneven.splits == 4);
  p.k_len = 4095;  // below 4096 keys: no chunk order
  CHECK_FALSE(plan::make(p, 8 * 128 * 4, false).chunk_major);
}

TEST_CASE("which K/V views count as KV heads interleaving in memory", "[eigen][layout]") {
  // (1, 4 heads, 64 keys, 8): tokens outermost interleave; heads outermost, a cache's views
  // with room past the keys, one KV head, a key stride of 0 and K in blocks with V by heads
  // do not.
  std::vector<float> buf(static_cast<std::size_t>(4 * 100 * 8));
  const float* x = buf.data();
  using view = alibi::tensor_view<const float, 4>;
  const view bshd = alibi::make_strided_view<const float, 4>(x, {1, 4, 64, 8}, {2048, 8, 32, 1});
  const view bhsd = alibi::make_strided_view<const float, 4>(x, {1, 4, 64, 8}, {2048, 512, 8, 1});
  const view cache = alibi::make_strided_view<const float, 4>(x, {1, 4, 64, 8}, {3200, 800, 8, 1});
  const view mqa = alibi::make_strided_view<const float, 4>(x, {1, 1, 64, 8}, {512, 8, 8, 1});
  const view still = alibi::make_strided_view<const float, 4>(x, {1, 4, 64, 8}, {32, 8, 0, 1});
  using source = alibi::detail::cpu::kv_source<float>;
  CHECK(source{bshd, bshd}.heads_interleave());
  CHECK(source{bhsd, bshd}.heads_interleave());
  CHECK_FALSE(source{bhsd, bhsd}.heads_interleave());
  CHECK_FALSE(source{cache, cache}.heads_interleave());
  CHECK_FALSE(source{mqa, mqa}.heads_interleave());
  CHECK_FALSE(source{still, still}.heads_interleave());
  const auto blocks = alibi::make_key_blocks(x, 1, 4, 64, 8);
  CHECK_FALSE(source{bshd, bhsd, blocks}.heads_interleave());
  CHECK(source{bhsd, bshd, blocks}.heads_interleave());
  // The token stride in bytes: the larger of V's and K's (K's only as rows).
  CHECK(source{bshd, bshd}.token_bytes() == 32 * 4);
  CHECK(source{bhsd, bshd}.token_bytes() == 32 * 4);
  CHECK(source{bshd, bhsd, blocks}.token_bytes() == 8 * 4);
}
