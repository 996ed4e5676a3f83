// SPDX-License-Identifier: MIT
// Far-tile skipping on the GPU: the CPU backend's far-tile tests on the CUDA backend. Skipping
// is real (tiles are skipped, and computed + skipped is the dense count), stays within the
// tolerance rule against the double oracle, skips whole far chunks of split-KV decoding, backs
// off on keys of huge norm, never engages without a positive slope or past a NaN key, and
// takes the caller's key-norm bounds.
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "cuda_common.cuh"

using alibi::index_t;
using alibi_test::case_data;
using alibi_test::case_spec;

namespace {

using alibi_test::skip_run;

/// Runs the CUDA backend with skipping on or off on a fresh case (`edit` may change its
/// inputs first), with optional caller key-norm bounds, and compares it with the oracle.
template <class T>
skip_run run_case(const case_spec& s, bool skip,
                  const std::function<void(case_data&)>& edit = nullptr,
                  const std::vector<float>* bounds = nullptr) {
  case_data c(s);
  if (edit) edit(c);
  alibi_test::device_buffer<float> bounds_d(bounds ? *bounds : std::vector<float>{});
  skip_run r;
  r.cmp = alibi_test::check_cuda_data<T>(
      c, nullptr,
      [&](const alibi::backend::cuda& be, const auto& q, const auto& k, const auto& v,
          const auto& out, alibi::attention_params p) {
        p.skip_far_tiles = skip;
        p.stats = &r.stats;
        if (bounds)
          p.key_norm_bounds = alibi::make_view<const float>(
              bounds_d.ptr, s.batch, s.hkv,
              (s.lk + alibi::key_norm_block - 1) / alibi::key_norm_block);
        alibi::attention(alibi_test::skipping(be), q, k, v, out, p);
      });
  return r;
}

/// Upper bounds on the norms of each block of key_norm_block keys (every key, valid or
/// not; NaN padding excluded by reading only the keys below k_len), times `loose`.
std::vector<float> host_bounds(const case_spec& s, float loose) {
  case_data c(s);
  const index_t blocks = (s.lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
  std::vector<float> out;
  for (index_t b = 0; b < s.batch; ++b)
    for (index_t h = 0; h < s.hkv; ++h)
      for (index_t t = 0; t < blocks; ++t) {
        double m = 0;
        for (index_t j = t * alibi::key_norm_block;
             j < std::min(s.lk, (t + 1) * alibi::key_norm_block); ++j) {
          double sq = 0;
          for (index_t d = 0; d < s.d; ++d)
            sq += double(c.k.view(b, h, j, d)) * c.k.view(b, h, j, d);
          m = std::max(m, std::sqrt(sq));
        }
        out.push_back(static_cast<float>(m * 1.001 * loose));
      }
  return out;
}

template <class T>
void skips_real_work() {
  for (bool causal : {true, false}) {
    case_spec s;
    s.lq = 1500;
    s.lk = 3000;
    s.hq = 8;  // slopes 1/2 .. 1/256, two per KV head
    s.hkv = 4;
    s.d = 64;
    s.causal = causal;
    const skip_run on = run_case<T>(s, true), off = run_case<T>(s, false);
    INFO(alibi_test::element_name<T>()
         << " " << s.name() << ": on " << on.cmp.describe() << "; off " << off.cmp.describe()
         << "; skipped " << on.stats.tiles_skipped << " of " << off.stats.tiles_computed);
    CHECK(on.cmp.ok());
    CHECK(off.cmp.ok());
    CHECK(off.stats.tiles_skipped == 0);
    CHECK(on.stats.tiles_skipped > 0);
    CHECK(on.stats.tiles_computed + on.stats.tiles_skipped == off.stats.tiles_computed);
    // The steep KV heads skip most far tiles, the shallowest (slopes 1/128, 1/256) none at
    // this length: at least a sixth of all tiles go.
    CHECK(on.stats.tiles_skipped * 6 > off.stats.tiles_computed);
  }
}

}  // namespace

TEST_CASE("cuda: far-tile skipping skips real work and stays within tolerance", "[cuda][skip]") {
  skips_real_work<float>();
  skips_real_work<__nv_bfloat16>();
  skips_real_work<__half>();
}

TEST_CASE("cuda: far-tile skipping on decode (whole chunks), windows, lengths and key masks",
          "[cuda][skip]") {
  std::vector<case_spec> cases(4);
  // Decoding, one query row per head of a GQA group of 4 (slopes 1/4 .. 1/256, so the
  // shallowest decides): split-KV chunks far from the query are skipped unread (the anchor).
  cases[0].lq = 1, cases[0].lk = 20000, cases[0].hq = 4, cases[0].hkv = 1, cases[0].d = 128,
  cases[0].causal = true;
  cases[1].lq = 700, cases[1].lk = 700, cases[1].hq = 6, cases[1].hkv = 6, cases[1].d = 32,
  cases[1].window_left = 400, cases[1].batch = 3, cases[1].lengths = true;
  cases[2].lq = 600, cases[2].lk = 2000, cases[2].hq = 2, cases[2].hkv = 2, cases[2].d = 64,
  cases[2].key_mask = true, cases[2].batch = 2, cases[2].offsets = true, cases[2].bshd = true;
  // Decoding MHA with several query tokens, lengths and a key mask, 16-byte aligned rows.
  cases[3].lq = 3, cases[3].lk = 20000, cases[3].hq = 4, cases[3].hkv = 4, cases[3].d = 64,
  cases[3].causal = true, cases[3].batch = 2, cases[3].lengths = true, cases[3].key_mask = true,
  cases[3].aligned = true;
  for (const case_spec& s : cases) {
    const skip_run on = run_case<__nv_bfloat16>(s, true), off = run_case<__nv_bfloat16>(s, false);
    const skip_run on32 = run_case<float>(s, true);
    INFO(s.name() << ": bf16 " << on.cmp.describe() << ", skipped " << on.stats.tiles_skipped
                  << " of " << off.stats.tiles_computed << "; float " << on32.cmp.describe()
                  << ", skipped " << on32.stats.tiles_skipped);
    CHECK(on.cmp.ok());
    CHECK(off.cmp.ok());
    CHECK(on32.cmp.ok());
    CHECK(on.stats.tiles_skipped > 0);
    CHECK(on32.stats.tiles_skipped > 0);
    CHECK(on.stats.tiles_computed + on.stats.tiles_skipped == off.stats.tiles_computed);
  }
}

TEST_CASE("cuda: far-tile skipping backs off on adversarial inputs", "[cuda][skip]") {
  // Query rows aligned with a few far keys of huge norm: their scores beat the ALiBi decay,
  // so a bound that ignored key norms would drop the keys that dominate the softmax.
  case_spec s;
  s.lq = 64;
  s.lk = 4096;
  s.hq = 1;
  s.hkv = 1;
  s.d = 64;
  s.slope_scale = 128.0f;  // slope 1/2
  s.causal = true;
  auto huge = [&](case_data& c) {
    for (index_t j : {10, 3700, 3750})
      for (index_t d = 0; d < s.d; ++d) c.k.view(0, 0, j, d) = 40.0f * c.q.view(0, 0, 63, d);
  };
  for (int type = 0; type < 2; ++type) {
    const skip_run on =
        type == 0 ? run_case<float>(s, true, huge) : run_case<__half>(s, true, huge);
    const skip_run base = type == 0 ? run_case<float>(s, true) : run_case<__half>(s, true);
    INFO((type == 0 ? "float" : "half")
         << ": " << on.cmp.describe() << ", skipped " << on.stats.tiles_skipped
         << ", without the huge keys " << base.stats.tiles_skipped);
    CHECK(on.cmp.ok());
    CHECK(base.cmp.ok());
    CHECK(on.stats.tiles_skipped < base.stats.tiles_skipped);
  }
}

TEST_CASE("cuda: far-tile skipping never engages without a positive slope or past a NaN key",
          "[cuda][skip]") {
  for (float ss : {0.0f, -0.25f}) {
    case_spec s;
    s.lq = 300;
    s.lk = 2000;
    s.hq = 2;
    s.hkv = 2;
    s.d = 32;
    s.slope_scale = ss;
    const skip_run on = run_case<__nv_bfloat16>(s, true);
    INFO(s.name() << ": " << on.cmp.describe());
    CHECK(on.cmp.ok());
    CHECK(on.stats.tiles_skipped == 0);
    CHECK(on.stats.tiles_computed > 0);
  }
  // A NaN in key 10 of KV head 0 (slope 1/16; seen by every causal row from 10 on): its
  // block's norm bound is NaN, so head 0 skips nothing left of it, and every row of head 0
  // that sees it is NaN. Head 1 (slope 1/256) skips nothing at this length either way.
  case_spec s;
  s.lq = 2000;
  s.lk = 2000;
  s.hq = 2;
  s.hkv = 2;
  s.d = 64;
  s.causal = true;
  alibi::attention_stats stats;
  case_data c(s);
  alibi_test::round_inputs<float>(c);
  c.k.view(0, 0, 10, 3) = std::numeric_limits<float>::quiet_NaN();
  alibi_test::device_case<float> dc(c);
  std::vector<float> out_h(static_cast<std::size_t>(2 * 2000 * 64));
  alibi_test::device_buffer<float> out(out_h);
  alibi::attention_params p = dc.params;
  p.stats = &stats;
  alibi::attention(alibi_test::skipping({}), dc.qv, dc.kv, dc.vv,
                   alibi::make_view(out.ptr, 1, 2, 2000, 64), p);
  out_h = out.download();
  index_t wrong = 0;
  for (index_t h = 0; h < 2; ++h)
    for (index_t i = 0; i < 2000; ++i) {
      const bool nan_row = std::isnan(out_h[static_cast<std::size_t>((h * 2000 + i) * 64)]);
      if (nan_row != (h == 0 && i >= 10)) ++wrong;
    }
  CHECK(wrong == 0);
  const skip_run clean = run_case<float>(s, true);
  INFO("skipped with the NaN key " << stats.tiles_skipped << ", without "
                                   << clean.stats.tiles_skipped);
  CHECK(clean.stats.tiles_skipped > 0);
  CHECK(stats.tiles_skipped == 0);
}

TEST_CASE("cuda: far-tile skipping with the caller's key-norm bounds", "[cuda][skip]") {
  for (index_t lq : {1, 5}) {
    case_spec s;
    s.batch = 2, s.lq = lq, s.lk = 3000, s.hq = 8, s.hkv = 2, s.d = 64, s.causal = true;
    const skip_run own = run_case<__nv_bfloat16>(s, true);
    const std::vector<float> tight = host_bounds(s, 1.0f), loose = host_bounds(s, 8.0f);
    const skip_run with_tight = run_case<__nv_bfloat16>(s, true, nullptr, &tight);
    const skip_run with_loose = run_case<__nv_bfloat16>(s, true, nullptr, &loose);
    std::vector<float> nan_bounds(tight.size(), std::numeric_limits<float>::quiet_NaN());
    const skip_run with_nan = run_case<__nv_bfloat16>(s, true, nullptr, &nan_bounds);
    INFO(s.name() << ": skipped own " << own.stats.tiles_skipped << ", tight "
                  << with_tight.stats.tiles_skipped << ", loose " << with_loose.stats.tiles_skipped
                  << ", NaN " << with_nan.stats.tiles_skipped);
    CHECK(own.cmp.ok());
    CHECK(with_tight.cmp.ok());
    CHECK(with_loose.cmp.ok());
    CHECK(with_nan.cmp.ok());
    CHECK(with_tight.stats.tiles_skipped > 0);
    CHECK(with_loose.stats.tiles_skipped < with_tight.stats.tiles_skipped);
    CHECK(with_nan.stats.tiles_skipped == 0);
    CHECK(with_nan.stats.tiles_computed == own.stats.tiles_computed + own.stats.tiles_skipped);
  }
  // alibi::key_norm_bounds on the device: the bounds the call forms itself, bit for bit
  // (every key valid here), so the same tiles are skipped and the output has the same bits;
  // with first_key, only the blocks from its block on are written.
  {
    case_spec s;
    s.batch = 2, s.lq = 1, s.lk = 3000, s.hq = 8, s.hkv = 2, s.d = 64, s.causal = true;
    s.aligned = true;
    case_data c(s);
    alibi_test::round_inputs<__nv_bfloat16>(c);
    alibi_test::device_case<__nv_bfloat16> dc(c);
    const index_t blocks = (s.lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
    alibi_test::device_buffer<float> bounds(
        std::vector<float>(static_cast<std::size_t>(s.batch * s.hkv * blocks), 1e30f));
    const auto bv = alibi::make_view(bounds.ptr, s.batch, s.hkv, blocks);
    alibi::key_norm_bounds(alibi::backend::cuda{}, dc.kv, bv, 1000);
    std::vector<float> partial = bounds.download();
    alibi::key_norm_bounds(alibi::backend::cuda{}, dc.kv, bv);
    const std::vector<float> full = bounds.download();
    index_t kept = 0, same = 0;
    for (std::size_t e = 0; e < full.size(); ++e) {
      const index_t t = static_cast<index_t>(e) % blocks;
      if (t < 1000 / alibi::key_norm_block)
        kept += partial[e] == 1e30f;
      else
        same += partial[e] == full[e];
    }
    CHECK(kept == s.batch * s.hkv * (1000 / alibi::key_norm_block));
    CHECK(same == s.batch * s.hkv * (blocks - 1000 / alibi::key_norm_block));
    auto run = [&](bool caller, alibi::attention_stats& stats) {
      alibi_test::device_buffer<__nv_bfloat16> out(
          std::vector<__nv_bfloat16>(static_cast<std::size_t>(s.batch * s.hq * s.d)));
      alibi::attention_params p = dc.params;
      p.stats = &stats;
      if (caller) p.key_norm_bounds = bv;
      alibi::attention(alibi_test::skipping({}), dc.qv, dc.kv, dc.vv,
                       alibi::make_view(out.ptr, s.batch, s.hq, 1, s.d), p);
      return out.download();
    };
    alibi::attention_stats own_stats, caller_stats;
    const std::vector<__nv_bfloat16> own = run(false, own_stats), with = run(true, caller_stats);
    INFO("skipped " << own_stats.tiles_skipped << " (own bounds), " << caller_stats.tiles_skipped
                    << " (alibi::key_norm_bounds)");
    CHECK(own_stats.tiles_skipped > 0);
    CHECK(own_stats.tiles_skipped == caller_stats.tiles_skipped);
    CHECK(std::memcmp(own.data(), with.data(), own.size() * sizeof(__nv_bfloat16)) == 0);
  }
  // A bounds view in host memory is refused by name.
  case_spec s;
  s.lq = 1, s.lk = 3000, s.d = 64;
  std::vector<float> host(24, 1.0f);
  CHECK_THROWS_WITH(
      [&] {
        case_data c(s);
        alibi_test::device_case<float> dc(c);
        alibi_test::device_buffer<float> out(std::vector<float>(64));
        alibi::attention_params p = dc.params;
        p.key_norm_bounds = alibi::make_view<const float>(host.data(), 1, 1, 24);
        alibi::attention(alibi_test::skipping({}), dc.qv, dc.kv, dc.vv,
                         alibi::make_view(out.ptr, 1, 1, 1, 64), p);
      }(),
      Catch::Contains("params.key_norm_bounds"));
}

TEST_CASE("cuda: far-tile skipping is opt-in, from backend::cuda::skip_min_keys keys on",
          "[cuda][skip]") {
  case_spec s;
  s.lq = 600, s.lk = 3000, s.hq = 2, s.hkv = 2, s.d = 64, s.causal = true, s.aligned = true;
  case_data c(s);
  alibi_test::round_inputs<__nv_bfloat16>(c);
  alibi_test::device_case<__nv_bfloat16> dc(c);
  alibi_test::device_buffer<__nv_bfloat16> out(
      std::vector<__nv_bfloat16>(static_cast<std::size_t>(s.hq * s.lq * s.d)));
  auto skipped = [&](const alibi::backend::cuda& be) {
    alibi::attention_stats stats;
    alibi::attention_params p = dc.params;
    p.stats = &stats;
    alibi::attention(be, dc.qv, dc.kv, dc.vv, alibi::make_view(out.ptr, 1, s.hq, s.lq, s.d), p);
    return stats.tiles_skipped;
  };
  alibi::backend::cuda on{};
  on.far_tile_skipping = true;  // from the default 16384 keys on
  CHECK(skipped(alibi::backend::cuda{}) == 0);
  CHECK(skipped(on) == 0);
  on.skip_min_keys = 3001;
  CHECK(skipped(on) == 0);
  on.skip_min_keys = 3000;
  CHECK(skipped(on) > 0);
}
