// SPDX-License-Identifier: MIT
// K in blocks (alibi/core/key_blocks.hpp): the eigen backend against the double-precision oracle
// on the shared grid (fp32, fp16 and bf16 storage), the reference reading blocks exactly,
// thread-count independence, the GQA grouping of small calls, and the argument checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

/// K of a case in blocks of T, in a buffer of NaN: gaps between blocks, heads and batch
/// entries and guards at both ends, so that a read outside the blocks' keys meets NaN. The
/// keys (NaN past the lengths, as in the case) are written with store_key_blocks; the lanes
/// of a last block past k_len stay NaN.
template <class T>
struct blocked_keys {
  static constexpr index_t guard = 41;
  std::vector<T> buf;
  alibi::tensor_view<T, 5> view;

  explicit blocked_keys(const padded_tensor<float>& k) {
    const index_t B = k.view.extents[0], H = k.view.extents[1], L = k.view.extents[2],
                  D = k.view.extents[3];
    const index_t nb = alibi::key_block_count(L);
    const index_t sblk = D * alibi::keys_per_block + 16, sh = nb * sblk + 32, sb = H * sh + 48;
    buf.assign(static_cast<std::size_t>(2 * guard + B * sb),
               static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
    view = alibi::make_strided_view<T, 5>(buf.data() + guard, {B, H, nb, D, alibi::keys_per_block},
                                          {sb, sh, sblk, alibi::keys_per_block, 1});
    alibi::store_key_blocks(alibi::tensor_view<const float, 4>(k.view), view);
  }
  alibi::tensor_view<const T, 5> cview() const { return view; }
};

/// The grid case with K/V rounded to T (exact for float), K in blocks (check_stored).
template <class T>
alibi_test::comparison check_blocked(const case_spec& spec, int threads) {
  return alibi_test::check_stored<T>(
      spec, [&](const case_data& c, const alibi::attention_params& p, auto out) {
        const blocked_keys<T> kb(c.k);
        const padded_tensor<T> vt = converted<T>(c.v, spec);
        alibi::attention(alibi::backend::eigen{threads}, c.q.view, kb.cview(),
                         alibi::tensor_view<const T, 4>(vt.view), out, p);
      });
}

}  // namespace

TEMPLATE_TEST_CASE("eigen backend with K in blocks matches the reference on the grid",
                   "[eigen][key_blocks][grid][heavy]", float, Eigen::half, Eigen::bfloat16) {
  std::vector<case_spec> cases = alibi_test::grid_cases();
  for (const case_spec& s : alibi_test::scale_cases()) cases.push_back(s);
  cases.push_back(alibi_test::value_dim_case());
  // Small calls whose tiles start inside a block (windows put a row's first key anywhere),
  // with GQA, lengths, offsets, and a key split (4099 keys).
  std::uint64_t seed = 900;
  for (index_t lq : {1, 5, 16})
    for (index_t wl : {37, 1001}) {
      case_spec c;
      c.lq = lq, c.lk = lq == 5 ? 4099 : 1500, c.d = lq == 16 ? 72 : 128;
      c.hq = 8, c.hkv = lq == 1 ? 8 : 2, c.batch = 3;
      c.causal = lq != 5;
      c.window_left = wl, c.window_right = c.causal ? -1 : 9;
      c.lengths = true, c.key_mask = lq == 16, c.offsets = lq == 1;
      c.seed = seed++;
      cases.push_back(c);
    }
  for (const case_spec& spec : cases) {
    INFO(spec.name());
    const alibi_test::comparison r = check_blocked<TestType>(spec, 2);
    INFO(r.describe());
    CHECK(r.ok());
  }
}

TEMPLATE_TEST_CASE("reference backend reads K in blocks exactly", "[reference][key_blocks]", float,
                   Eigen::half) {
  case_spec spec;
  spec.batch = 2, spec.hq = 4, spec.hkv = 2, spec.lq = 9, spec.lk = 40, spec.d = 16;
  spec.causal = true, spec.key_mask = true, spec.lengths = true;
  case_data c(spec);
  round_to<TestType>(c.k);
  round_to<TestType>(c.v);
  const padded_tensor<TestType> kt = converted<TestType>(c.k, spec),
                                vt = converted<TestType>(c.v, spec);
  const blocked_keys<TestType> kb(c.k);
  std::vector<double> rows(static_cast<std::size_t>(spec.batch * spec.hq * spec.lq * spec.d));
  std::vector<double> blocks(rows.size(), 1.0);
  const auto v = alibi::tensor_view<const TestType, 4>(vt.view);
  alibi::attention(alibi::backend::reference{}, c.q.view,
                   alibi::tensor_view<const TestType, 4>(kt.view), v,
                   alibi::make_view(rows.data(), spec.batch, spec.hq, spec.lq, spec.d), c.params);
  alibi::attention(alibi::backend::reference{}, c.q.view, kb.cview(), v,
                   alibi::make_view(blocks.data(), spec.batch, spec.hq, spec.lq, spec.d), c.params);
  CHECK(std::memcmp(rows.data(), blocks.data(), rows.size() * sizeof(double)) == 0);
}

TEMPLATE_TEST_CASE("K in blocks: results do not depend on the thread count",
                   "[eigen][key_blocks][determinism]", float, Eigen::bfloat16) {
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
    const blocked_keys<TestType> kb(c.k);
    const padded_tensor<TestType> vt = converted<TestType>(c.v, spec);
    const alibi::tensor_view<const TestType, 4> v(vt.view);
    const alibi_test::out_lse one = run_eigen(c, kb.cview(), v, 1);
    for (int threads : {2, 3, 8}) {
      const alibi_test::out_lse r = run_eigen(c, kb.cview(), v, threads);
      CHECK(same_bits(r.out, one.out));
      CHECK(same_bits(r.lse, one.lse));
    }
  }
}

TEMPLATE_TEST_CASE("K in blocks, small calls: a GQA group equals its heads computed alone",
                   "[eigen][key_blocks][gqa]", float, Eigen::half) {
  // As the row-layout test in test_half_kv.cpp: the GQA problem against the same problem
  // with K/V copied to every query head, bitwise (no key split below 2 * 2048 keys). Window
  // and offsets put the tiles' first keys inside blocks.
  for (index_t lq : {1, 3, 16}) {
    for (bool skip : {false, true}) {
      case_spec spec;
      spec.batch = 2, spec.hq = 8, spec.hkv = 2, spec.lq = lq, spec.lk = 2000, spec.d = 64;
      spec.causal = true, spec.lengths = true, spec.key_mask = lq == 3, spec.offsets = lq == 16;
      spec.window_left = lq == 1 ? 1001 : -1;
      INFO(spec.name() << (skip ? ", skipping" : ""));
      case_data c(spec);
      const case_data d = alibi_test::per_head_copy(c);
      const blocked_keys<TestType> kc(c.k), kd(d.k);
      const padded_tensor<TestType> vc = converted<TestType>(c.v, spec),
                                    vd = converted<TestType>(d.v, d.spec);
      const alibi_test::out_lse grouped =
          run_eigen(c, kc.cview(), alibi::tensor_view<const TestType, 4>(vc.view), 2, skip);
      const alibi_test::out_lse alone =
          run_eigen(c, kd.cview(), alibi::tensor_view<const TestType, 4>(vd.view), 2, skip);
      CHECK(same_bits(grouped.out, alone.out));
      CHECK(same_bits(grouped.lse, alone.lse));
    }
  }
}

TEST_CASE("K in blocks: far-tile skipping with bounds from the blocks or the caller",
          "[eigen][key_blocks][skip]") {
  // A long decode step: bounds computed in the call from the blocks skip tiles; the caller's
  // bounds (alibi::key_norm_bounds on the same keys as rows) are the ones used when given:
  // they make the same decisions as for K as rows with the same bounds, and NaN bounds
  // disable skipping. (The values are checked on the grid, skipping included.)
  case_spec spec;
  spec.hq = 8, spec.hkv = 2, spec.lq = 1, spec.lk = 9000, spec.d = 128, spec.causal = true;
  case_data c(spec);
  round_to<Eigen::half>(c.k);
  const blocked_keys<Eigen::half> kb(c.k);
  const padded_tensor<Eigen::half> kt = converted<Eigen::half>(c.k, spec),
                                   vt = converted<Eigen::half>(c.v, spec);
  const auto k_rows = alibi::tensor_view<const Eigen::half, 4>(kt.view);
  const auto v = alibi::tensor_view<const Eigen::half, 4>(vt.view);
  const index_t nblocks = (spec.lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
  std::vector<float> bounds(static_cast<std::size_t>(spec.hkv * nblocks));
  alibi::key_norm_bounds(k_rows, alibi::make_view(bounds.data(), 1, spec.hkv, nblocks));
  std::vector<float> out(static_cast<std::size_t>(spec.hq * spec.d));
  auto stats_of = [&](auto k, const float* given) {
    alibi::attention_stats st;
    alibi::attention_params p = c.params;
    p.stats = &st;
    if (given) p.key_norm_bounds = alibi::make_view(given, 1, spec.hkv, nblocks);
    alibi::attention(alibi::backend::eigen{2}, c.q.view, k, v,
                     alibi::make_view(out.data(), 1, spec.hq, 1, spec.d), p);
    for (float x : out) REQUIRE(std::isfinite(x));
    return st;
  };
  const alibi::attention_stats own = stats_of(kb.cview(), nullptr);
  CHECK(own.tiles_skipped > 0);
  CHECK(own.tiles_computed + own.tiles_skipped == spec.hq * nblocks);
  const alibi::attention_stats given = stats_of(kb.cview(), bounds.data());
  const alibi::attention_stats rows = stats_of(k_rows, bounds.data());
  CHECK(given.tiles_skipped > 0);
  CHECK(given.tiles_skipped == rows.tiles_skipped);
  const std::vector<float> nan_bounds(bounds.size(), std::numeric_limits<float>::quiet_NaN());
  CHECK(stats_of(kb.cview(), nan_bounds.data()).tiles_skipped == 0);
}

TEST_CASE("K in blocks: argument checks", "[key_blocks][validation]") {
  const index_t B = 1, H = 2, L = 20, D = 8;
  std::vector<float> q(static_cast<std::size_t>(B * H * 3 * D), 0.5f), out(q.size());
  std::vector<float> k(static_cast<std::size_t>(B * H * 2 * D * 16), 0.25f);
  std::vector<float> v(static_cast<std::size_t>(B * H * L * D), 1.0f);
  const auto qv = alibi::make_view<const float>(q.data(), B, H, 3, D);
  const auto vv = alibi::make_view<const float>(v.data(), B, H, L, D);
  const auto ov = alibi::make_view(out.data(), B, H, 3, D);
  const alibi::backend::eigen be{1};
  auto message = [&](alibi::tensor_view<const float, 5> kb) {
    return std::string(alibi::can_implement(be, qv, kb, vv, ov).message());
  };
  CHECK(alibi::can_implement(be, qv, alibi::make_key_blocks<const float>(k.data(), B, H, L, D), vv,
                             ov));
  // Block count: ceil(20 / 16) = 2.
  CHECK_THAT(message(alibi::make_view<const float>(k.data(), B, H, 1, D, 16)),
             Catch::Contains("ceil(k_len / 16)") && Catch::Contains("k_len = v.extent(2) = 20"));
  CHECK_THAT(message(alibi::make_view<const float>(k.data(), B, H, 4, D, 8)),
             Catch::Contains("(1, 2, 4, 8, 8)"));
  // Blocks must be contiguous (head_dim, 16) matrices.
  CHECK_THAT(message(alibi::make_strided_view<const float, 5>(
                 k.data(), {B, H, 2, D, 16}, {H * 2 * D * 16, 2 * D * 16, 1, 16, D})),
             Catch::Contains("stride(4) 1 and stride(3) 16"));
  // Head dim against q's, heads against v's.
  CHECK_THAT(message(alibi::make_view<const float>(k.data(), B, H, 2, D / 2, 16)),
             Catch::Contains("k.extent(3) (head_dim)"));
  CHECK_THAT(message(alibi::make_view<const float>(k.data(), B, 1, 2, D, 16)),
             Catch::Contains("v must have k's heads"));
  CHECK_THROWS_AS(
      alibi::attention(be, qv, alibi::make_view<const float>(k.data(), B, H, 1, D, 16), vv, ov),
      alibi::error);

  // store_key_blocks: shapes and the key range.
  std::vector<float> rows(static_cast<std::size_t>(B * H * 5 * D), 2.0f);
  const auto rv = alibi::make_view<const float>(rows.data(), B, H, 5, D);
  const auto kb = alibi::make_key_blocks(k.data(), B, H, L, D);
  alibi::store_key_blocks(rv, kb, 15);  // keys 15 .. 19: across the block boundary
  CHECK(kb(0, 1, 0, 3, 15) == 2.0f);
  CHECK(kb(0, 1, 1, 3, 3) == 2.0f);
  CHECK(kb(0, 1, 1, 3, 4) == 0.25f);
  CHECK_THROWS_WITH(alibi::store_key_blocks(rv, kb, 28),
                    Catch::Contains("[28, 33) must lie within the blocks' 32 keys"));
  CHECK_THROWS_WITH(alibi::store_key_blocks(rv, alibi::make_key_blocks(k.data(), B, H, L, D / 2)),
                    Catch::Contains("blocks must have shape"));
}

TEMPLATE_TEST_CASE("blocked Q K^T: a row's scores do not depend on the rows beside it",
                   "[eigen][key_blocks][small_rows]", float, Eigen::half, Eigen::bfloat16) {
  // small_block_scores (backend/eigen/small_rows.hpp) on 7 rows at once (blocks of 4, 2 and
  // 1 rows) against each row alone, bitwise, and against a double-precision dot product of
  // the same stored values; tiles starting at every lane of a block, lengths that end
  // inside a block, head dims with and without whole packets. Scores outside the tile stay
  // untouched.
  namespace cpu = alibi::detail::cpu;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const index_t m = 7, lds = 160;
  auto none = [] {};
  for (index_t d : {1, 7, 64, 128, 136})
    for (index_t off : {0, 1, 9, 15})
      for (index_t bk : {1, 15, 16, 37, 128}) {
        INFO("d = " << d << ", off = " << off << ", bk = " << bk);
        const index_t blocks = alibi::key_block_count(off + bk), ldk = d * 16 + 8;
        std::vector<TestType> k(static_cast<std::size_t>(blocks * ldk));
        for (TestType& x : k) x = static_cast<TestType>(nd(gen));
        std::vector<float> q(static_cast<std::size_t>(m * d));
        for (float& x : q) x = nd(gen);
        std::vector<float> s_all(static_cast<std::size_t>(m * lds), -7.0f), s_one(s_all);
        std::vector<const float*> qr;
        std::vector<float*> sr;
        for (index_t t = 0; t < m; ++t) {
          qr.push_back(q.data() + t * d);
          sr.push_back(s_all.data() + t * lds);
        }
        cpu::small_block_scores(qr.data(), m, k.data(), ldk, off, bk, d, sr.data(), none);
        for (index_t t = 0; t < m; ++t) {
          float* s1 = s_one.data() + t * lds;
          cpu::small_block_scores(qr.data() + t, 1, k.data(), ldk, off, bk, d, &s1, none);
        }
        CHECK(same_bits(s_all, s_one));
        double worst = 0;
        index_t untouched = 0;
        const double u = std::ldexp(1.0, -24);
        for (index_t t = 0; t < m; ++t) {
          for (index_t r = 0; r < bk; ++r) {
            const index_t key = off + r;
            double dot = 0, mag = 0;
            for (index_t e = 0; e < d; ++e) {
              const double x =
                  q[t * d + e] *
                  static_cast<double>(static_cast<float>(k[(key / 16) * ldk + e * 16 + key % 16]));
              dot += x;
              mag += std::abs(x);
            }
            worst = std::max(worst, std::abs(s_all[t * lds + r] - dot) / std::max(mag, 1e-300));
          }
          for (index_t r = bk; r < lds; ++r) untouched += s_all[t * lds + r] == -7.0f;
        }
        CHECK(untouched == m * (lds - bk));
        CHECK(worst <= d * u / (1 - d * u));
      }
}
