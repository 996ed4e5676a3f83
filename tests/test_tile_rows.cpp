// SPDX-License-Identifier: MIT
// The host/device tile arithmetic of the CUDA kernel, run on the CPU: per-tile distances
// and allowed columns against alibi_bias and key_range, the base-2 online softmax against
// a direct softmax, and the tensor-core fragment layouts against an emulation of ldmatrix
// and mma.sync built from the PTX fragment definitions.
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <alibi/detail/mma_layout.hpp>
#include <alibi/detail/tile_rows.hpp>
#include <catch2/catch.hpp>

using alibi::index_t;
namespace ad = alibi::detail;

namespace {

ad::attention_problem problem(index_t lq, index_t lk, bool causal, index_t wl, index_t wr,
                              const index_t* q_off, const index_t* k_off) {
  ad::attention_problem p;
  p.batch = 1;
  p.q_heads = p.kv_heads = 1;
  p.q_len = lq;
  p.k_len = lk;
  p.head_dim = p.v_head_dim = 64;
  p.mask.causal = causal;
  p.mask.window_left = wl;
  p.mask.window_right = wr;
  if (q_off) p.q_offsets = alibi::make_view(q_off, 1);
  if (k_off) p.k_offsets = alibi::make_view(k_off, 1);
  return p;
}

}  // namespace

TEST_CASE("tile frames give the exact shifted distance and the allowed columns", "[tile_rows]") {
  const index_t big = index_t(1) << 45;
  const index_t q_offs[] = {0, 500, big + 3, -200};
  const index_t k_offs[] = {0, 0, big, 900};
  int checked = 0;
  for (int o = 0; o < 4; ++o)
    for (int m = 0; m < 4; ++m) {
      const bool causal = m == 1 || m == 3;
      const index_t wl = m >= 2 ? 37 : -1, wr = m == 2 ? 5 : -1;
      const ad::attention_problem p =
          problem(300, 1000, causal, wl, wr, o ? &q_offs[o] : nullptr, o ? &k_offs[o] : nullptr);
      for (index_t i = 0; i < 300; i += 7) {
        const ad::row_frame f = ad::make_row_frame(p, 0, 0, i);
        const alibi::index_range kr = p.key_range(0, i);
        const index_t qp = p.q_offset(0) + i;
        for (index_t j0 = 0; j0 < 1000; j0 += 64)
          for (int lane_shift : {0, 2, 6}) {
            const ad::tile_frame tf = ad::make_tile_frame(f, j0 + lane_shift, 64);
            // The compact 32-bit frame the CUDA kernel keeps gives the same tile frame.
            const ad::tile_frame tf32 = ad::make_tile_frame(
                ad::make_row_frame32(f), static_cast<std::int32_t>(j0 + lane_shift), 64);
            REQUIRE(tf32.a == tf.a);
            REQUIRE(tf32.b == tf.b);
            REQUIRE(tf32.begin == tf.begin);
            REQUIRE(tf32.end == tf.end);
            for (int c = 0; c < 64 && j0 + lane_shift + c < 1000; ++c) {
              const index_t j = j0 + lane_shift + c;
              const bool allowed = j >= kr.begin && j < kr.end;
              REQUIRE((c >= tf.begin && c < tf.end) == allowed);
              if (!allowed) continue;
              const index_t kp = p.k_offset(0) + j;
              const index_t want = (qp >= kp ? qp - kp : kp - qp) - f.shift;
              REQUIRE(want >= 0);
              REQUIRE(ad::tile_distance(tf, static_cast<float>(c)) == static_cast<float>(want));
              // The same bias as the one formula every backend uses.
              REQUIRE(-0.25f * ad::tile_distance(tf, static_cast<float>(c)) ==
                      alibi::alibi_bias(0.25f, qp, kp, f.shift));
              ++checked;
            }
          }
      }
    }
  CHECK(checked > 100000);
}

TEST_CASE("padded rows get no keys", "[tile_rows]") {
  const index_t lengths[] = {5};
  ad::attention_problem p = problem(8, 8, true, -1, -1, nullptr, nullptr);
  p.q_lengths = alibi::make_view(lengths, 1);
  const ad::row_frame f = ad::make_row_frame(p, 0, 0, 6);
  CHECK(f.end <= f.begin);
  const ad::tile_frame tf = ad::make_tile_frame(f, 0, 64);
  CHECK(tf.end == tf.begin);
}

TEST_CASE("base-2 online softmax over tiles equals the direct softmax", "[tile_rows]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> randn(0.0f, 4.0f);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(200);
    for (float& s : x) s = randn(rng);
    for (int j = 0; j < 64; ++j) x[static_cast<std::size_t>(j)] = neg_inf;  // first tile masked
    float m = neg_inf, l = 0.0f, acc = 0.0f;
    for (std::size_t t0 = 0; t0 < x.size(); t0 += 64) {
      float mx = neg_inf;
      for (std::size_t j = t0; j < std::min(x.size(), t0 + 64); ++j) mx = std::fmax(mx, x[j]);
      const ad::online_step st = ad::online_update(m, mx);
      REQUIRE(std::isfinite(st.factor));
      m = st.m;
      l *= st.factor;
      acc *= st.factor;
      for (std::size_t j = t0; j < std::min(x.size(), t0 + 64); ++j) {
        const float p = ad::fast_exp2(x[j] - st.ref);
        l += p;
        acc += p * static_cast<float>(j);  // v_j = j
      }
    }
    double dm = -1e300, dl = 0, dacc = 0;
    for (float s : x) dm = std::max(dm, static_cast<double>(s));
    for (std::size_t j = 0; j < x.size(); ++j) {
      const double p = std::exp2(static_cast<double>(x[j]) - dm);
      dl += p;
      dacc += p * static_cast<double>(j);
    }
    CHECK(std::abs(acc / l - dacc / dl) <= 1e-4 * (dacc / dl));
    ad::row_frame f;
    f.slope = 0.5f;
    f.shift = 10;
    const double want = (dm + std::log2(dl)) * std::log(2.0) - 5.0;
    CHECK(std::abs(ad::finish_lse_l2(m, l, f) - want) <= 1e-5 * std::max(1.0, std::abs(want)));
  }
  ad::row_frame f;
  CHECK(ad::finish_lse_l2(neg_inf, 0.0f, f) == neg_inf);
  CHECK(std::isnan(ad::finish_lse_l2(1.0f, std::numeric_limits<float>::quiet_NaN(), f)));
  // Nothing seen yet and an all-masked tile: no NaN, factor 0.
  const ad::online_step st = ad::online_update(neg_inf, neg_inf);
  CHECK(st.ref == 0.0f);
  CHECK(st.factor == 0.0f);
}

namespace {

// An emulation of ldmatrix.x4 (optionally .trans) on a row-major matrix of floats standing
// for 16-bit elements, per the PTX ISA: lanes 8i..8i+7 supply the row addresses of matrix
// i; without .trans lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of each matrix, with
// .trans rows 2(l%4), 2(l%4)+1 of column l/4.
using frag = std::array<std::array<float, 2>, 4>;  // 4 registers x 2 halves

template <class Addr>
std::array<frag, 32> ldmatrix(const std::vector<float>& m, int ld, int row0, int col0, Addr addr,
                              bool trans) {
  std::array<frag, 32> out{};
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 2; ++h) {
        int r, c;  // within matrix i
        if (!trans) {
          r = lane / 4;
          c = 2 * (lane % 4) + h;
        } else {
          r = 2 * (lane % 4) + h;
          c = lane / 4;
        }
        const ad::lane_offset o = addr(8 * i + r);  // the lane that supplied row r of matrix i
        out[static_cast<std::size_t>(lane)][static_cast<std::size_t>(i)]
           [static_cast<std::size_t>(h)] =
               m[static_cast<std::size_t>((row0 + o.row) * ld + col0 + o.col + c)];
      }
  return out;
}

// mma.sync m16n8k16 per the PTX fragment tables: A a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..),
// a3 (g+8, 2t+8..); B b0 (k 2t.., n g), b1 (k 2t+8.., n g); C c0,c1 (g, 2t..), c2,c3 (g+8, 2t..).
void mma(std::array<std::array<float, 4>, 32>& c, const std::array<frag, 32>& a,
         const std::array<frag, 32>& b, int breg) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const auto& fa = a[static_cast<std::size_t>(lane)];
    const auto& fb = b[static_cast<std::size_t>(lane)];
    for (int h = 0; h < 2; ++h) {
      A[g][2 * t + h] = fa[0][h];
      A[g + 8][2 * t + h] = fa[1][h];
      A[g][2 * t + 8 + h] = fa[2][h];
      A[g + 8][2 * t + 8 + h] = fa[3][h];
      B[2 * t + h][g] = fb[static_cast<std::size_t>(breg)][h];
      B[2 * t + 8 + h][g] = fb[static_cast<std::size_t>(breg + 1)][h];
    }
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const ad::lane_offset o = ad::acc_element(lane, e);
      float s = 0;
      for (int k = 0; k < 16; ++k) s += A[o.row][k] * B[k][o.col];
      c[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)] += s;
    }
}

}  // namespace

TEST_CASE("tensor-core fragment layouts compute Q K^T and P V", "[tile_rows][mma]") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-4, 4);
  const int ld = 40;  // padded smem rows
  std::vector<float> q(16 * ld), k(32 * ld), v(32 * ld);
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = static_cast<float>(small(rng));
  // S = Q K^T over 32 head dims (2 k-steps) for 16 keys (two 8-key tiles).
  std::array<std::array<float, 4>, 32> s0{}, s1{};
  for (int ks = 0; ks < 2; ++ks) {
    const auto a = ldmatrix(q, ld, 0, ks * 16, ad::ldsm_a, false);
    const auto b = ldmatrix(k, ld, 0, ks * 16, ad::ldsm_b_nmajor, false);
    mma(s0, a, b, 0);
    mma(s1, a, b, 2);
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const ad::lane_offset o = ad::acc_element(lane, e);
      for (int tile = 0; tile < 2; ++tile) {
        float want = 0;
        for (int d = 0; d < 32; ++d)
          want += q[static_cast<std::size_t>(o.row * ld + d)] *
                  k[static_cast<std::size_t>((tile * 8 + o.col) * ld + d)];
        const float got =
            (tile == 0 ? s0 : s1)[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)];
        REQUIRE(got == want);
      }
    }
  // O = P V with P taken from the two S accumulator tiles as an A fragment (16 keys), V
  // k-major through ldmatrix.trans, for 16 head dims (two 8-column tiles).
  std::array<frag, 32> pa{};
  for (int lane = 0; lane < 32; ++lane)
    for (int h = 0; h < 2; ++h) {
      const auto L = static_cast<std::size_t>(lane);
      pa[L][0][static_cast<std::size_t>(h)] = s0[L][static_cast<std::size_t>(h)];
      pa[L][1][static_cast<std::size_t>(h)] = s0[L][static_cast<std::size_t>(2 + h)];
      pa[L][2][static_cast<std::size_t>(h)] = s1[L][static_cast<std::size_t>(h)];
      pa[L][3][static_cast<std::size_t>(h)] = s1[L][static_cast<std::size_t>(2 + h)];
    }
  std::array<std::array<float, 4>, 32> o0{}, o1{};
  const auto vb = ldmatrix(v, ld, 0, 0, ad::ldsm_b_kmajor, true);
  mma(o0, pa, vb, 0);
  mma(o1, pa, vb, 2);
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const ad::lane_offset o = ad::acc_element(lane, e);
      for (int tile = 0; tile < 2; ++tile) {
        float want = 0;
        for (int j = 0; j < 16; ++j) {
          float sj = 0;
          for (int d = 0; d < 32; ++d)
            sj += q[static_cast<std::size_t>(o.row * ld + d)] *
                  k[static_cast<std::size_t>(j * ld + d)];
          want += sj * v[static_cast<std::size_t>(j * ld + tile * 8 + o.col)];
        }
        const float got =
            (tile == 0 ? o0 : o1)[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)];
        REQUIRE(got == want);
      }
    }
}
