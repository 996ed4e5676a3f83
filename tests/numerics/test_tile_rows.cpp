// SPDX-License-Identifier: MIT
// The host/device tile arithmetic of the CUDA kernel, run on the CPU: per-tile distances
// and allowed columns against alibi_bias and key_range, the shared base-2 online softmax
// state (alibi/numerics/online_softmax.hpp) as the kernels use it (tiles, key-warp and split
// merges, masked and NaN rows) against a direct softmax, and the tensor-core fragment
// layouts against an emulation of ldmatrix and mma.sync built from the PTX fragment
// definitions.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <alibi/backend/cuda/mma_layout.hpp>
#include <alibi/numerics/tile_frame.hpp>
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
  const index_t q_offs[] = {0, 500, big + 3, -200, -big, 4000};
  const index_t k_offs[] = {0, 0, big, 900, 0, 0};
  int checked = 0, negative_rows = 0;
  // A negative slope's bias grows with distance, so its frame is shifted by the row's
  // farthest allowed key (where its largest bias is): every shifted distance is then <= 0.
  for (const float slope_sign : {1.0f, -1.0f})
    for (int o = 0; o < 6; ++o)
      for (int m = 0; m < 4; ++m) {
        const bool causal = m == 1 || m == 3;
        const index_t wl = m >= 2 ? 37 : -1, wr = m == 2 ? 5 : -1;
        ad::attention_problem p =
            problem(300, 1000, causal, wl, wr, o ? &q_offs[o] : nullptr, o ? &k_offs[o] : nullptr);
        p.slopes.scale = slope_sign;
        for (index_t i = 0; i < 300; i += 7) {
          const ad::row_frame f = ad::make_row_frame(p, 0, 0, i);
          REQUIRE(f.slope == p.slope(0, 0));
          REQUIRE((f.slope < 0.0f) == (slope_sign < 0.0f));
          const alibi::index_range kr = p.key_range(0, i);
          const index_t qp = p.q_offset(0) + i;
          REQUIRE(f.shift == p.distance_shift(0, i, slope_sign < 0.0f));
          if (slope_sign < 0.0f && !kr.empty()) ++negative_rows;
          index_t closest_to_zero = std::numeric_limits<index_t>::max();
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
                REQUIRE(slope_sign * static_cast<float>(want) >= 0.0f);
                closest_to_zero = std::min(closest_to_zero, want < 0 ? -want : want);
                REQUIRE(ad::tile_distance(tf, static_cast<float>(c)) == static_cast<float>(want));
                // The same bias as the one formula every backend uses.
                const float s = 0.25f * slope_sign;
                REQUIRE(-s * ad::tile_distance(tf, static_cast<float>(c)) ==
                        alibi::alibi_bias(s, qp, kp, f.shift));
                ++checked;
              }
            }
          // The shift is a distance some allowed key has: the row's largest bias is 0.
          if (!kr.empty()) REQUIRE(closest_to_zero == 0);
        }
      }
  CHECK(checked > 200000);
  CHECK(negative_rows > 500);
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

namespace {

const float neg_inf = -std::numeric_limits<float>::infinity();
const float nan_f = std::numeric_limits<float>::quiet_NaN();

/// One row through the CUDA kernel's per-tile online softmax, as the kernel does it: the
/// tile maximum with fmax (which ignores NaN), the state's step, P = 2^(s - ref), the tile
/// sum added to the state, and an output accumulator (v_j = j) rescaled by the factor.
struct row_result {
  ad::softmax_state st;
  float acc = 0.0f;  // unnormalized sum of p_j * j
};

row_result tiled_row(const std::vector<float>& x, std::size_t begin, std::size_t end,
                     std::size_t tile) {
  row_result r;
  for (std::size_t t0 = begin; t0 < end; t0 += tile) {
    const std::size_t t1 = std::min(end, t0 + tile);
    float mx = neg_inf;
    for (std::size_t j = t0; j < t1; ++j) mx = std::fmax(mx, x[j]);
    const ad::softmax_step step = r.st.rescale(mx);
    REQUIRE(!std::isnan(step.factor));
    r.acc *= step.factor;
    float sum = 0.0f;
    for (std::size_t j = t0; j < t1; ++j) {
      const float p = ad::exp2_flush(x[j] - step.ref);
      sum += p;
      r.acc += p * static_cast<float>(j);
    }
    r.st.add(step, sum);
  }
  return r;
}

/// The direct softmax in double precision over x[begin, end): the weighted mean of j and
/// the base-2 logsumexp.
struct direct_result {
  double mean = 0, lse2 = -std::numeric_limits<double>::infinity();
};

direct_result direct_row(const std::vector<float>& x, std::size_t begin, std::size_t end) {
  double dm = -std::numeric_limits<double>::infinity(), dl = 0, dacc = 0;
  for (std::size_t j = begin; j < end; ++j) dm = std::max(dm, static_cast<double>(x[j]));
  direct_result d;
  if (dm == -std::numeric_limits<double>::infinity()) return d;
  for (std::size_t j = begin; j < end; ++j) {
    const double p = std::exp2(static_cast<double>(x[j]) - dm);
    dl += p;
    dacc += p * static_cast<double>(j);
  }
  d.mean = dacc / dl;
  d.lse2 = dm + std::log2(dl);
  return d;
}

bool close(double got, double want, double rel) {
  return std::abs(got - want) <= rel * std::max(1.0, std::abs(want));
}

}  // namespace

TEST_CASE("base-2 online softmax over tiles equals the direct softmax", "[tile_rows]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> randn(0.0f, 4.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(200);
    for (float& s : x) s = randn(rng);
    for (int j = 0; j < 64; ++j) x[static_cast<std::size_t>(j)] = neg_inf;     // first tile masked
    for (int j = 130; j < 140; ++j) x[static_cast<std::size_t>(j)] = neg_inf;  // partly masked
    const row_result r = tiled_row(x, 0, x.size(), 64);
    const direct_result d = direct_row(x, 0, x.size());
    CHECK(close(r.acc * r.st.inverse_sum(), d.mean, 1e-4));
    CHECK(close(r.st.lse2(), d.lse2, 1e-5));
    // The natural-log logsumexp with the distance shift added back (slope 0.5, shift 10).
    const double want = d.lse2 * std::log(2.0) - 5.0;
    CHECK(close(r.st.lse(-0.5f * 10.0f), want, 1e-5));
  }
  // Nothing seen yet and an all-masked tile: no NaN, factor 0, reference 0.
  ad::softmax_state st;
  const ad::softmax_step step = st.rescale(neg_inf);
  CHECK(step.ref == 0.0f);
  CHECK(step.factor == 0.0f);
  CHECK(st.m == neg_inf);
}

TEST_CASE("merging the states of two key halves equals the whole row", "[tile_rows]") {
  std::mt19937 rng(4);
  std::normal_distribution<float> randn(0.0f, 6.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(300);
    for (float& s : x) s = randn(rng);
    // Some trials mask a whole half (a key warp or split without keys).
    if (trial % 5 == 1)
      for (std::size_t j = 0; j < 128; ++j) x[j] = neg_inf;
    if (trial % 5 == 2)
      for (std::size_t j = 128; j < 300; ++j) x[j] = neg_inf;
    const std::size_t half = 128;
    const row_result a = tiled_row(x, 0, half, 64), b = tiled_row(x, half, x.size(), 64);
    const direct_result d = direct_row(x, 0, x.size());
    // The decoding warps' merge: unnormalized outputs weighted by wa, wb.
    const ad::softmax_merge mg = ad::merge_states(a.st, b.st);
    const float acc = a.acc * mg.wa + b.acc * mg.wb;
    CHECK(close(acc * mg.state.inverse_sum(), d.mean, 1e-4));
    CHECK(close(mg.state.lse2(), d.lse2, 1e-5));
    // The split-KV merge: normalized partial outputs with their base-2 logsumexps, rebuilt
    // as states (m = lse2, l = 1) and merged in order from the empty state; splits with no
    // weight are skipped.
    ad::softmax_state st;
    float out = 0.0f;
    for (const row_result* part : {&a, &b}) {
      const ad::softmax_state ps = ad::softmax_state::from_lse2(part->st.lse2());
      const float o = part->acc * part->st.inverse_sum();
      const ad::softmax_merge m = ad::merge_states(st, ps);
      out = (m.wa != 0.0f ? out * m.wa : 0.0f) + (m.wb != 0.0f ? m.wb * o : 0.0f);
      st = m.state;
    }
    CHECK(close(out * st.inverse_sum(), d.mean, 1e-4));
    CHECK(close(st.lse2(), d.lse2, 1e-5));
  }
}

TEST_CASE("logsumexp round trips through from_lse and from_lse2", "[tile_rows]") {
  for (float lse : {-30.5f, -1.0f, 0.0f, 0.25f, 7.0f, 1000.0f}) {
    const ad::softmax_state s = ad::softmax_state::from_lse(lse);
    CHECK(s.l == 1.0f);
    CHECK(close(s.lse(), lse, 1e-6));
    const ad::softmax_state s2 = ad::softmax_state::from_lse2(lse);
    CHECK(s2.m == lse);  // exact: no round trip through the natural log
    CHECK(s2.l == 1.0f);
    CHECK(s2.lse2() == lse);
  }
  for (const ad::softmax_state& s :
       {ad::softmax_state::from_lse(neg_inf), ad::softmax_state::from_lse2(neg_inf)}) {
    CHECK(s.m == neg_inf);
    CHECK(s.l == 0.0f);
    CHECK(s.lse() == neg_inf);
  }
  CHECK(std::isnan(ad::softmax_state::from_lse2(nan_f).lse2()));
  CHECK(std::isnan(ad::softmax_state::from_lse(nan_f).lse()));
}

TEST_CASE("fully masked rows give output 0 and logsumexp -inf", "[tile_rows]") {
  std::vector<float> x(150, neg_inf);
  const row_result r = tiled_row(x, 0, x.size(), 64);
  CHECK(r.st.m == neg_inf);
  CHECK(r.st.l == 0.0f);
  CHECK(r.acc == 0.0f);
  CHECK(r.st.inverse_sum() == 0.0f);
  CHECK(r.acc * r.st.inverse_sum() == 0.0f);
  CHECK(r.st.lse2() == neg_inf);
  CHECK(r.st.lse(-3.0f) == neg_inf);
  // Padded rows: no tiles at all.
  const row_result empty = tiled_row(x, 0, 0, 64);
  CHECK(empty.st.inverse_sum() == 0.0f);
  CHECK(empty.st.lse(1.0f) == neg_inf);
  // Merging empty states (key warps or splits without keys) stays empty, weights 0.
  const ad::softmax_merge mg = ad::merge_states(r.st, empty.st);
  CHECK(mg.wa == 0.0f);
  CHECK(mg.wb == 0.0f);
  CHECK(mg.state.l == 0.0f);
  CHECK(mg.state.lse() == neg_inf);
}

TEST_CASE("a NaN score makes its row NaN on every path", "[tile_rows]") {
  std::mt19937 rng(6);
  std::normal_distribution<float> randn(0.0f, 2.0f);
  std::vector<float> x(150);
  for (float& s : x) s = randn(rng);
  x[100] = nan_f;
  // Tiled: fmax ignores the NaN in the tile maximum; it reaches the sum through 2^(NaN - ref).
  const row_result r = tiled_row(x, 0, x.size(), 64);
  CHECK(!std::isnan(r.st.m));
  CHECK(std::isnan(r.st.l));
  CHECK(std::isnan(r.st.inverse_sum()));
  CHECK(std::isnan(r.acc * r.st.inverse_sum()));
  CHECK(std::isnan(r.st.lse2()));
  CHECK(std::isnan(r.st.lse(-1.0f)));
  // Also when every other score is masked (m stays -inf).
  std::vector<float> masked(64, neg_inf);
  masked[5] = nan_f;
  const row_result rm = tiled_row(masked, 0, masked.size(), 64);
  CHECK(std::isnan(rm.st.l));
  CHECK(std::isnan(rm.st.lse2()));
  // The careful path: one key at a time, the state keeps the NaN maximum.
  ad::softmax_state st;
  for (float s : x) {
    const ad::softmax_step step = st.rescale(s);
    st.add(step, ad::exp2_flush(s - step.ref));
  }
  CHECK(std::isnan(st.m));
  CHECK(std::isnan(st.inverse_sum()));
  CHECK(std::isnan(st.lse()));
  // Merges: a NaN side makes the merged state NaN, in either order.
  const row_result ok = tiled_row(x, 0, 64, 64);
  for (const auto& mg : {ad::merge_states(ok.st, r.st), ad::merge_states(r.st, ok.st),
                         ad::merge_states(ad::softmax_state::from_lse2(nan_f), ok.st),
                         ad::merge_states(ok.st, ad::softmax_state::from_lse2(nan_f))})
    CHECK(std::isnan(mg.state.lse2()));
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
