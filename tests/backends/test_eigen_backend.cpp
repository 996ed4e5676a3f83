// SPDX-License-Identifier: MIT
// The fused CPU backend against the double-precision oracle on the shared case list, plus
// thread-count independence and prefill-then-decode equivalence.
#include <cstring>
#include <initializer_list>
#include <thread>
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

TEST_CASE("eigen backend: v_head_dim 0 with split keys, on a fresh thread", "[eigen][edge]") {
  // Few rows and many keys split the keys into chunks; with Dv = 0 the partial outputs
  // take no memory, and a fresh thread has never allocated that buffer: the chunks must
  // still be merged for the logsumexp, not written as final results by each chunk.
  case_spec c;
  c.batch = 1, c.hq = 1, c.hkv = 1, c.lq = 1, c.lk = 4096, c.d = 8, c.dv = 0;
  alibi_test::comparison r;
  std::thread([&] { r = alibi_test::check_backend(alibi::backend::eigen{1}, c); }).join();
  INFO(r.describe());
  CHECK(r.ok());
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

/// The same values with each token's rows of all heads followed by as many unused (NaN)
/// elements: rows of KV heads that interleave without making one run (as K and V of one
/// (batch, seq, 2, heads, dim) tensor do).
void spread_tokens(alibi_test::padded_tensor<float>& t) {
  const alibi::tensor_view<float, 4> from = t.view;
  const index_t b = from.extents[0], s = from.extents[2], token = 2 * from.strides[2];
  std::vector<float> buf(static_cast<std::size_t>(b * s * token + t.guard), t.fill);
  const alibi::tensor_view<float, 4> to = alibi::make_strided_view<float, 4>(
      buf.data(), from.extents, {s * token, from.strides[1], token, 1});
  t.for_each([&](float x, index_t bi, index_t h, index_t i, index_t e) { to(bi, h, i, e) = x; });
  t.buf = std::move(buf);
  t.view = to;
}

/// Each case with K/V stored with the tokens outermost ((batch, seq, heads, dim) memory; with
/// `spread`, spread_tokens), head dim d, skipping off, against the oracle, on every thread
/// count of `threads`, each result bitwise that of the first; case i draws its values from
/// seed + i.
void check_tokens_outermost(std::vector<case_spec> cases, index_t d, std::uint64_t seed,
                            std::initializer_list<int> threads, bool spread) {
  for (std::size_t i = 0; i < cases.size(); ++i) {
    case_spec& spec = cases[i];
    spec.d = d, spec.bshd = true, spec.seed = seed + i;
    INFO(spec.name() << (spread ? " spread" : ""));
    alibi_test::case_data c(spec);
    if (spread) {
      spread_tokens(c.k);
      spread_tokens(c.v);
    }
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
  // by chunk (work_plan), one KV head at a time in chunks of 2048 keys with these short
  // token rows (spread), or every query head of a batch entry together (dense token rows).
  // Uneven last chunks, GQA and MHA, masks and lengths; 16 units of one KV head (which
  // otherwise take no split); 36865 keys (18 splits of 2049 keys, rounded up to whole
  // tiles: 2176, recounted to 17 chunks so that none starts past the last key).
  std::vector<case_spec> cases(4);
  cases[0].batch = 2, cases[0].hq = 4, cases[0].hkv = 2, cases[0].lq = 3, cases[0].lk = 4096;
  cases[0].causal = true;
  cases[1].batch = 2, cases[1].hq = 4, cases[1].hkv = 4, cases[1].lq = 1, cases[1].lk = 6001;
  cases[1].lengths = true, cases[1].key_mask = true;
  cases[2].batch = 2, cases[2].hq = 8, cases[2].hkv = 8, cases[2].lq = 1, cases[2].lk = 4096;
  cases[3].batch = 1, cases[3].hq = 4, cases[3].hkv = 2, cases[3].lq = 2, cases[3].lk = 36865;
  cases[3].causal = true;
  // Dense token rows: every query head of a batch entry together (all_kv_heads); spread:
  // key chunks per KV head.
  check_tokens_outermost(cases, 32, 40, {1, 2, 3}, false);
  check_tokens_outermost(cases, 32, 40, {1, 2, 3}, true);
}

TEST_CASE(
    "small calls over all KV heads together give each head the bits of its KV head's heads "
    "alone",
    "[eigen][decode][layout]") {
  // 4096 keys, one batch entry, 8 KV heads of D 122 (rows padded to 130 floats; a scalar
  // tail with any packet width): every query head together (dense token rows) and one KV
  // head's query heads at a time (spread_tokens: 8320 bytes from a head's token row to the
  // next, chunks of about 504 keys) both split the keys in 8 chunks of 512 (work_plan), so
  // each head computes the same tiles in the same order with the same arithmetic either way.
  for (index_t lq : {1, 3}) {
    case_spec spec;
    spec.hq = 16, spec.hkv = 8, spec.lq = lq, spec.lk = 4096, spec.d = 122, spec.bshd = true;
    spec.aligned = true;
    spec.key_mask = lq == 3;
    INFO(spec.name());
    alibi_test::case_data packed(spec), spread(spec);
    spread_tokens(spread.k);
    spread_tokens(spread.v);
    std::vector<std::vector<float>> outs;
    for (alibi_test::case_data* c : {&packed, &spread}) {
      std::vector<float> out(static_cast<std::size_t>(spec.hq * lq * spec.d));
      std::vector<float> lse(static_cast<std::size_t>(spec.hq * lq));
      alibi::attention_params p = c->params;
      p.skip_far_tiles = false;
      p.logsumexp = alibi::make_view(lse.data(), 1, spec.hq, lq);
      alibi::attention(alibi::backend::eigen{2}, c->q.view, c->k.view, c->v.view,
                       alibi::make_view(out.data(), 1, spec.hq, lq, spec.d), p);
      out.insert(out.end(), lse.begin(), lse.end());
      outs.push_back(out);
    }
    CHECK(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)) == 0);
  }
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
  check_tokens_outermost(cases, 128, 50, {1, 2}, true);
  check_tokens_outermost(cases, 128, 50, {1, 2}, false);
}

TEST_CASE("the key chunks of small calls over interleaved KV heads follow the token stride",
          "[eigen][layout]") {
  // About interleaved_chunk_bytes (4 MiB) of each head's rows per chunk, 256 to 2048 keys,
  // whole tiles; only with interleaved heads, skipping off and at least 4096 keys.
  using plan = alibi::detail::cpu::work_plan;
  auto strided = [](index_t token_bytes) {  // rows of a KV head that are not one run
    alibi::detail::cpu::kv_memory m;
    m.token_bytes = token_bytes;
    return m;
  };
  alibi::detail::attention_problem p;
  p.batch = 1, p.q_heads = 32, p.kv_heads = 32, p.q_len = 1, p.k_len = 32768;
  p.head_dim = p.v_head_dim = 128;
  const plan fp32_mha = plan::make(p, strided(32 * 128 * 4), false);  // 16 KiB: 256 keys
  CHECK(fp32_mha.chunk_major);
  CHECK_FALSE(fp32_mha.all_kv_heads);
  CHECK(fp32_mha.group == 1);
  CHECK(fp32_mha.chunk == 256);
  CHECK(fp32_mha.splits == 128);
  const plan fp16_mha = plan::make(p, strided(32 * 128 * 2), false);  // 8 KiB: 512 keys
  CHECK(fp16_mha.chunk == 512);
  const plan tiny = plan::make(p, strided(1 << 20), false);  // beyond 4 MiB per 256 keys: 256
  CHECK(tiny.chunk == 256);
  CHECK(plan::make(p, strided(256), false).chunk == 2048);  // short rows: at most 2048 keys
  CHECK_FALSE(plan::make(p, strided(0), false).chunk_major);
  CHECK_FALSE(plan::make(p, strided(32 * 128 * 4), true).chunk_major);
  p.kv_heads = 8;
  const plan fp32_gqa = plan::make(p, strided(8 * 128 * 4), false);  // 4 KiB: 1024 keys
  CHECK(fp32_gqa.chunk == 1024);
  CHECK(fp32_gqa.splits == 32);
  CHECK(fp32_gqa.group == 4);
  p.k_len = 4500;  // 4 chunks of about 1024 keys: 1152 (whole tiles), the last of 1044
  const plan uneven = plan::make(p, strided(8 * 128 * 4), false);
  CHECK(uneven.chunk == 1152);
  CHECK(uneven.splits == 4);
  p.k_len = 4095;  // below 4096 keys: no chunk order
  CHECK_FALSE(plan::make(p, strided(8 * 128 * 4), false).chunk_major);
}

TEST_CASE("the partial results of a split call stay within max_partial_bytes", "[eigen][layout]") {
  // Many sequences of 16 query rows over K and V of one (batch, seq, 2, heads, dim) tensor
  // (32 KiB per token: chunks of 256 keys): 128 chunks of 2048 items x 16 rows, each an
  // output row of 128 floats and a softmax state, would take about 2.2 GB. As many chunks
  // as fit in max_partial_bytes (256 MiB: 15) instead; a call with few items keeps its 128.
  using plan = alibi::detail::cpu::work_plan;
  using cfg = alibi::detail::cpu::kernel_config;
  alibi::detail::cpu::kv_memory pairs;
  pairs.token_bytes = 2 * 32 * 128 * 4;
  alibi::detail::attention_problem p;
  p.batch = 64, p.q_heads = 32, p.kv_heads = 32, p.q_len = 16, p.k_len = 32768;
  p.head_dim = p.v_head_dim = 128;
  const index_t row_bytes = 128 * 4 + index_t(sizeof(alibi::detail::softmax_state));
  const plan many = plan::make(p, pairs, false);
  const index_t split_bytes = many.items * many.rows_stride * row_bytes;
  CHECK(many.items == 2048);
  CHECK(many.rows_stride == 16);
  CHECK(many.splits == cfg::max_partial_bytes / split_bytes);  // 15
  CHECK(many.splits > 1);
  CHECK(many.splits * split_bytes <= cfg::max_partial_bytes);
  p.batch = 1;
  CHECK(plan::make(p, pairs, false).splits == 128);
}

TEST_CASE("small calls over K/V rows of all KV heads in one run take every query head together",
          "[eigen][layout]") {
  // A dense (batch, seq, heads, dim) cache: a unit is all the query heads of a batch entry
  // (all_kv_heads); while there are fewer than min_items units, each takes about
  // min_items / units key chunks of at least 512 keys (whole tiles).
  using plan = alibi::detail::cpu::work_plan;
  alibi::detail::cpu::kv_memory packed;
  packed.token_bytes = 8 * 128 * 2;
  packed.token_rows_packed = true;
  alibi::detail::attention_problem p;
  p.batch = 1, p.q_heads = 32, p.kv_heads = 8, p.q_len = 1, p.k_len = 32768;
  p.head_dim = p.v_head_dim = 128;
  const plan one = plan::make(p, packed, false);
  CHECK(one.all_kv_heads);
  CHECK(one.group == 32);
  CHECK(one.units == 1);
  CHECK(one.chunk == 2048);
  CHECK(one.splits == 16);
  p.k_len = 4096;  // 8 chunks of 512 keys (min_kv_heads_chunk_keys)
  const plan short_cache = plan::make(p, packed, false);
  CHECK(short_cache.splits == 8);
  CHECK(short_cache.chunk == 512);
  p.k_len = 5000;  // 9 chunks of 556 keys, rounded up to whole tiles: 8 of 640, the last of 520
  const plan uneven = plan::make(p, packed, false);
  CHECK(uneven.splits == 8);
  CHECK(uneven.chunk == 640);
  p.batch = 4, p.q_len = 3, p.k_len = 32768;  // 4 units: 4 chunks each
  const plan four = plan::make(p, packed, false);
  CHECK(four.units == 4);
  CHECK(four.splits == 4);
  CHECK(four.chunk == 8192);
  p.batch = 16;  // enough units: one pass each
  CHECK(plan::make(p, packed, false).splits == 1);
  CHECK_FALSE(plan::make(p, packed, true).all_kv_heads);  // skipping: one KV head per unit
  p.k_len = 4095;
  CHECK_FALSE(plan::make(p, packed, false).all_kv_heads);
  p.k_len = 32768, p.q_len = alibi::detail::cpu::kernel_config::small_rows + 1;
  CHECK_FALSE(plan::make(p, packed, false).all_kv_heads);  // not a small call
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
  // All heads' rows of a token as one run with the next token's: dense tokens outermost,
  // or rows padded by less than a quarter of the token stride (the test harness's 5 floats
  // past rows of 8: (3 * 13 + 8) / 52 of each token); not K and V in one tensor (half of
  // each token), not with the heads outermost, not K in blocks.
  CHECK(source{bshd, bshd}.token_rows_packed());
  const view padded = alibi::make_strided_view<const float, 4>(x, {1, 4, 60, 8}, {3200, 13, 52, 1});
  CHECK(source{padded, padded}.token_rows_packed());
  CHECK(source{padded, padded}.token_span(true) == 3 * 13 + 8);
  const view kv_pairs =
      alibi::make_strided_view<const float, 4>(x, {1, 4, 32, 8}, {2048, 8, 64, 1});
  CHECK(source{kv_pairs, kv_pairs}.heads_interleave());
  CHECK_FALSE(source{kv_pairs, kv_pairs}.token_rows_packed());
  CHECK_FALSE(source{bhsd, bshd}.token_rows_packed());
  CHECK_FALSE(source{bhsd, bshd, blocks}.token_rows_packed());
  CHECK(source{bshd, bshd}.token_run_bytes(true, 3) == (2 * 32 + 32) * 4);
  CHECK(source{bshd, bshd}.token_run_bytes(false, 0) == 0);
  // Blocks of about 256 KiB of all heads' rows, clamped to 16 to 32 keys.
  CHECK(source{bshd, bshd}.token_block_keys() == 32);
  // What a call's plan makes of them (4096 keys, one query row).
  alibi::detail::attention_problem p;
  p.batch = 1, p.q_heads = 4, p.kv_heads = 4, p.q_len = 1, p.k_len = 4096, p.head_dim = 8;
  p.v_head_dim = 8;
  using alibi::detail::cpu::kv_memory;
  using alibi::detail::cpu::work_plan;
  CHECK(work_plan::make(p, kv_memory::of(source{padded, padded}), false).all_kv_heads);
  const work_plan pairs = work_plan::make(p, kv_memory::of(source{kv_pairs, kv_pairs}), false);
  CHECK_FALSE(pairs.all_kv_heads);
  CHECK(pairs.chunk_major);
  CHECK_FALSE(work_plan::make(p, kv_memory::of(source{bhsd, bhsd}), false).chunk_major);
}
