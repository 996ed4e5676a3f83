// SPDX-License-Identifier: MIT
// Bias matrices and masks against hand-computed small cases.
#include <cmath>
#include <limits>
#include <vector>

#include <catch2/catch.hpp>

#include <alibi/alibi.hpp>

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();
}

TEST_CASE("symmetric bias, 2 heads, 3 x 3", "[bias]") {
  // Slopes of a 2-head model: 1/16, 1/256.
  const auto t = alibi::bias_matrix(2, 3, 3);
  const float s0 = 1.0f / 16, s1 = 1.0f / 256;
  const float expect0[3][3] = {{0, -s0, -2 * s0}, {-s0, 0, -s0}, {-2 * s0, -s0, 0}};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      CHECK(t(0, i, j) == expect0[i][j]);
      CHECK(t(1, i, j) == -s1 * static_cast<float>(std::abs(i - j)));
    }
}

TEST_CASE("causal bias with q_len < k_len is bottom-right aligned", "[bias]") {
  alibi::attention_params p;
  p.mask.causal = true;
  // 1 head (slope 1/256), 2 queries, 4 keys: queries sit at positions 2 and 3.
  const auto t = alibi::bias_matrix(1, 2, 4, p);
  const float s = 1.0f / 256;
  const float expect[2][4] = {{-2 * s, -s, 0, -inf}, {-3 * s, -2 * s, -s, 0}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) CHECK(t(0, i, j) == expect[i][j]);
}

TEST_CASE("causal bias with q_len > k_len masks the first rows entirely", "[bias]") {
  alibi::attention_params p;
  p.mask.causal = true;
  const auto t = alibi::bias_matrix(1, 3, 2, p);  // queries at positions -1, 0, 1
  CHECK(t(0, 0, 0) == -inf);
  CHECK(t(0, 0, 1) == -inf);
  CHECK(t(0, 1, 0) == 0.0f);
  CHECK(t(0, 1, 1) == -inf);
  CHECK(t(0, 2, 0) == -1.0f / 256);
}

TEST_CASE("sliding window, offsets and per-batch lengths", "[bias]") {
  alibi::attention_params p;
  p.mask.window_left = 1;
  p.mask.window_right = 0;
  std::vector<alibi::index_t> qo = {10, 0}, ko = {8, 0}, lk = {4, 2}, lq = {2, 1};
  p.q_offsets = alibi::make_view<const alibi::index_t>(qo.data(), 2);
  p.k_offsets = alibi::make_view<const alibi::index_t>(ko.data(), 2);
  p.k_lengths = alibi::make_view<const alibi::index_t>(lk.data(), 2);
  p.q_lengths = alibi::make_view<const alibi::index_t>(lq.data(), 2);
  std::vector<float> buf(2 * 1 * 2 * 4);
  alibi::fill_bias(alibi::make_view(buf.data(), 2, 1, 2, 4), p);
  const float s = 1.0f / 256;
  // Batch 0: query positions 10, 11; keys 8..11. Window keeps k_pos in [q_pos - 1, q_pos].
  const float b0[2][4] = {{-inf, -s, 0, -inf}, {-inf, -inf, -s, 0}};
  // Batch 1: one query at 0 (row 1 padded), two keys at 0, 1.
  const float b1[2][4] = {{0, -inf, -inf, -inf}, {-inf, -inf, -inf, -inf}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      CHECK(buf[static_cast<std::size_t>(i * 4 + j)] == b0[i][j]);
      CHECK(buf[static_cast<std::size_t>(8 + i * 4 + j)] == b1[i][j]);
    }
}

TEST_CASE("bias is exact at large absolute positions", "[bias]") {
  // Positions near 2^40: the bias still comes from the exact small distance.
  const alibi::index_t base = alibi::index_t(1) << 40;
  for (alibi::index_t d : {0, 1, 3, 1000}) {
    CHECK(alibi::alibi_bias(0.5f, base + d, base) == -0.5f * static_cast<float>(d));
    CHECK(alibi::alibi_bias(0.5f, base, base + d) == -0.5f * static_cast<float>(d));
  }
  // Distances past fp16's range (65504) stay finite in fp32.
  CHECK(std::isfinite(alibi::alibi_bias(8.0f, 1 << 20, 0)));
}

TEST_CASE("key ranges of the masks are contiguous and correct", "[bias]") {
  alibi::mask_spec m;
  m.causal = true;
  m.window_left = 3;
  for (alibi::index_t q = -2; q < 12; ++q) {
    const alibi::index_range r = m.key_range(q, 0, 10);
    for (alibi::index_t j = 0; j < 10; ++j) CHECK((j >= r.begin && j < r.end) == m.allows(q, j));
  }
}

TEST_CASE("any_allowed: a run of queries sees a key exactly when one of its rows does", "[bias]") {
  // Every mask of small windows (and unbounded ones, and the widest), causal or not, over
  // runs of queries and keys placed before, across and after each other, against key_range
  // row by row.
  using alibi::index_t;
  constexpr index_t wide = std::numeric_limits<index_t>::max();
  const index_t windows[] = {-1, 0, 1, 2, 5, wide};
  index_t runs = 0, seen = 0;
  for (const bool causal : {false, true})
    for (const index_t left : windows)
      for (const index_t right : windows) {
        alibi::mask_spec m;
        m.causal = causal;
        m.window_left = left;
        m.window_right = right;
        for (index_t q_pos = -6; q_pos <= 12; ++q_pos)
          for (index_t q_len = 0; q_len <= 7; ++q_len)
            for (index_t k_len = 0; k_len <= 5; ++k_len) {
              const index_t k_offset = 3;
              bool any = false;
              for (index_t i = 0; i < q_len && !any; ++i)
                any = !m.key_range(q_pos + i, k_offset, k_len).empty();
              INFO("causal " << causal << ", window (" << left << ", " << right << "), queries "
                             << q_pos << " + " << q_len << ", keys 3 + " << k_len);
              REQUIRE(m.any_allowed(q_pos, q_len, k_offset, k_len) == any);
              ++runs;
              seen += any;
            }
      }
  CHECK(seen > 0);
  CHECK(seen < runs);
}

TEST_CASE("bias with ALiBi disabled and caller slopes", "[bias]") {
  alibi::attention_params p;
  p.slopes = alibi::slope_config::none();
  const auto t = alibi::bias_matrix(1, 2, 2, p);
  CHECK(t(0, 0, 1) == 0.0f);
  const float mine[2] = {0.25f, 2.0f};
  p.slopes = alibi::slope_config::per_head(mine, 2);
  const auto u = alibi::bias_matrix(2, 2, 3, p);
  CHECK(u(0, 0, 2) == -0.25f);  // query 0 at position 1, key 2
  CHECK(u(1, 1, 0) == -4.0f);   // queries at positions 1, 2
}

TEST_CASE("Eigen adapters round-trip and reject strided views", "[bias][eigen]") {
  Eigen::Tensor<float, 3, Eigen::RowMajor> t(2, 3, 4);
  t.setRandom();
  const auto view = alibi::from_eigen(t);
  CHECK(view.extent(0) == 2);
  CHECK(view.stride(0) == 12);
  CHECK(view(1, 2, 3) == t(1, 2, 3));
  const auto cview =
      alibi::from_eigen(static_cast<const Eigen::Tensor<float, 3, Eigen::RowMajor>&>(t));
  const auto back = alibi::to_eigen(cview);  // a const map over the same data
  CHECK(back(1, 0, 2) == t(1, 0, 2));
  auto strided = alibi::from_eigen(t);
  strided.extents[2] = 2;  // every other column: not dense
  strided.strides[2] = 2;
  CHECK_THROWS_WITH(alibi::to_eigen(strided),
                    Catch::Contains("must be dense row-major; stride(2) is 2, expected 1"));
}
