// SPDX-License-Identifier: MIT
// The two products of the fused CPU kernel for tiles with few query rows (decoding, a few
// speculative tokens, the query heads of one GQA group together): S = Q K^T and O += P V
// over one key tile, written with Eigen's packet primitives. Why not Eigen's GEMM: with a
// handful of rows a GEMM call packs the K or V tile before using it, and a GEMV streams it
// once per row; these loops read each K and V row once for all the rows, which is what keeps
// a decode step at the speed of memory.
//
// Every output element is accumulated in an order that depends only on its own row (packets
// along the head dimension, then the tail; keys in ascending order), never on which or how
// many other rows share the call: a query head computes the same bits alone or in a group.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/backend/host/simd.hpp"
#include "alibi/core/key_blocks.hpp"
#include "alibi/core/tensor_view.hpp"

namespace alibi {
namespace detail {
namespace cpu {
inline namespace ALIBI_CPU_ISA {

/// The vector registers the products may plan their accumulators for.
#if defined(__AVX512F__) || defined(__aarch64__)
inline constexpr int vector_registers = 32;
#else
inline constexpr int vector_registers = 16;
#endif

/// How many key rows of `width` floats make 16 KiB (at least 8): a block of K or V rows that
/// stays in L1 while every row of a small call goes over it.
inline index_t l1_block_keys(index_t width) {
  return std::max<index_t>(8, index_t(4096) / std::max<index_t>(width, 1));
}

#if defined(EIGEN_VECTORIZE_AVX512)
/// The sums of the lanes of eight packets, in one reduction tree: sum i in lane i. Each
/// sum folds its packet in halves (lane l with lane l + 8, then l + 4, l + 2, l + 1), the
/// order of one_sum below, so a sum does not depend on the packets beside it.
ALIBI_FORCEINLINE __m256 eight_sums(const packet* acc) {
  // Halves: pairs of packets into one, lanes [0, 8) from the first and [8, 16) from the
  // second, each lane l the sum of lanes l and l + 8 of its packet.
  __m512 h[4];
  for (int i = 0; i < 4; ++i)
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xee));
  // Quarters: 128-bit lane q of f[r] holds packet 4 r + q folded to four lanes (lane l
  // plus lane l + 4 of its 8-lane sums).
  __m512 f[2];
  for (int r = 0; r < 2; ++r)
    f[r] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * r], h[2 * r + 1], 0x88),
                         _mm512_shuffle_f32x4(h[2 * r], h[2 * r + 1], 0xdd));
  // Eighths, in each 128-bit lane q: [f0 l0 + l2, f0 l1 + l3, f1 l0 + l2, f1 l1 + l3].
  const __m512 e =
      _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x44), _mm512_shuffle_ps(f[0], f[1], 0xee));
  // The last fold, lane 0 plus lane 1 of each pair: packet q's sum lands in lane 4 q,
  // packet 4 + q's in lane 4 q + 2.
  const __m512 x = _mm512_add_ps(e, _mm512_permute_ps(e, 0xb1));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, x));
}

/// The sum of one packet's lanes, folded in halves as in eight_sums (Eigen's predux does the
/// same with AVX-512DQ, and adds the four 128-bit lanes pairwise without it).
ALIBI_FORCEINLINE float one_sum(const packet& a) {
  const __m256 x = _mm256_add_ps(_mm512_castps512_ps256(a),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 z = _mm_add_ps(y, _mm_movehl_ps(y, y));
  return _mm_cvtss_f32(_mm_add_ss(z, _mm_shuffle_ps(z, z, 1)));
}

/// s[t][j + u] = sums[t * J + u] for the R x J = 8 sums of eight_sums.
template <int R, int J>
ALIBI_FORCEINLINE void store_sums(__m256 sums, float* const* s, index_t j) {
  static_assert(R * J == 8, "eight sums");
  if constexpr (R == 1) {
    _mm256_storeu_ps(s[0] + j, sums);
  } else {
    const __m128 lo = _mm256_castps256_ps128(sums), hi = _mm256_extractf128_ps(sums, 1);
    if constexpr (R == 2) {
      _mm_storeu_ps(s[0] + j, lo);
      _mm_storeu_ps(s[1] + j, hi);
    } else {
      _mm_storel_pi(reinterpret_cast<__m64*>(s[0] + j), lo);
      _mm_storeh_pi(reinterpret_cast<__m64*>(s[1] + j), lo);
      _mm_storel_pi(reinterpret_cast<__m64*>(s[2] + j), hi);
      _mm_storeh_pi(reinterpret_cast<__m64*>(s[3] + j), hi);
    }
  }
}
#endif

/// out[i] = the sum of the lanes of acc[i], for N packets, in an order that depends only on
/// acc[i] (so a query row's scores do not depend on the rows computed beside it).
template <int N>
ALIBI_FORCEINLINE void sum_lanes(const packet* acc, float* out) {
#if defined(EIGEN_VECTORIZE_AVX512)
  if constexpr (N % 8 == 0) {
    for (int g = 0; g < N / 8; ++g) _mm256_storeu_ps(out + 8 * g, eight_sums(acc + 8 * g));
  } else {
    for (int i = 0; i < N; ++i) out[i] = one_sum(acc[i]);
  }
#else
  for (int i = 0; i < N; ++i) out[i] = Eigen::internal::predux(acc[i]);
#endif
}

/// s[t][j + u] = sums[t * J + u] + the scalar tail [dp, d) of q[t] . k[u], for R rows and
/// J key rows: the last step of every blocking of the dot products, so each of them ends a
/// result with the same operations.
template <int R, int J, class T>
ALIBI_FORCEINLINE void store_with_tails(const float* sums, const float* const* q, const T* const* k,
                                        index_t dp, index_t d, float* const* s, index_t j) {
  for (int t = 0; t < R; ++t)
    for (int u = 0; u < J; ++u) {
      float tail = 0.0f;
      // std::fma: the same operations in every instantiation (see pv_rows' tail).
      for (index_t e = dp; e < d; ++e) tail = std::fma(q[t][e], static_cast<float>(k[u][e]), tail);
      s[t][j + u] = sums[t * J + u] + tail;
    }
}

/// s[t][j + u] = q[t] . k[u] for R rows q[t] and J key rows k[u] (d elements each, stored as
/// T), each pair with one accumulator: packets along d, summed (sum_lanes), then the scalar
/// tail. R x J independent chains keep the FMA units busy whatever the number of rows;
/// each result's order is its own.
template <int R, int J, class T>
ALIBI_FORCEINLINE void dot_block(const float* const* q, const T* const* k, index_t d,
                                 float* const* s, index_t j) {
  namespace ei = Eigen::internal;
  const index_t dp = d / lanes * lanes;
  packet acc[R * J];
  for (int i = 0; i < R * J; ++i) acc[i] = ei::pset1<packet>(0.0f);
  for (index_t e = 0; e < dp; e += lanes) {
    packet kp[J];
    for (int u = 0; u < J; ++u) kp[u] = R > 1 ? load_shared(k[u] + e) : load_floats(k[u] + e);
    for (int t = 0; t < R; ++t) {
      const packet qp = ei::ploadu<packet>(q[t] + e);
      for (int u = 0; u < J; ++u) acc[t * J + u] = ei::pmadd(qp, kp[u], acc[t * J + u]);
    }
  }
#if defined(EIGEN_VECTORIZE_AVX512)
  if constexpr (R * J % 8 == 0 && 8 % J == 0) {
    if (dp == d) {  // no tail: the sums go from registers to the score rows, 8 at a time
      constexpr int rows8 = 8 / J;
      for (int g = 0; g < R / rows8; ++g)
        store_sums<rows8, J>(eight_sums(acc + 8 * g), s + g * rows8, j);
      return;
    }
  }
#endif
  float sums[R * J];
  sum_lanes<R * J>(acc, sums);
  store_with_tails<R, J>(sums, q, k, dp, d, s, j);
}

#if defined(EIGEN_VECTORIZE_AVX512)
/// The end of a blocking with R x J = 8 accumulators (row t, key u at acc[t * J + u]) over
/// the J key rows from k (leading dimension ldk): s[t][j + u] = the sum of the lanes, plus
/// the scalar tail [dp, d) when the head dim has one.
template <int R, int J, class T>
ALIBI_FORCEINLINE void finish_eight(const packet* acc, const float* const* q, const T* k,
                                    index_t ldk, index_t dp, index_t d, float* const* s,
                                    index_t j) {
  if (dp == d) {
    store_sums<R, J>(eight_sums(acc), s, j);
    return;
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, eight_sums(acc));
  const T* kr[J];
  for (int u = 0; u < J; ++u) kr[u] = k + u * ldk;
  store_with_tails<R, J>(sums, q, kr, dp, d, s, j);
}

/// dot_block for two rows whose NP packets (the head dimension without its tail) are held in
/// registers for the whole key tile, four keys at a time: only the K rows are loaded in the
/// loop. The same arithmetic in the same order as dot_block (packets in ascending order into
/// one accumulator per pair, eight_sums, then the scalar tail), so the results are bitwise
/// those of the other row blockings.
template <int NP, class T>
ALIBI_FORCEINLINE void dot_pair4(const packet (&qv)[2][NP], const float* const* q, const T* k,
                                 index_t ldk, index_t d, float* const* s, index_t j) {
  namespace ei = Eigen::internal;
  constexpr index_t dp = NP * lanes;
  packet acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = ei::pset1<packet>(0.0f);
  for (int c = 0; c < NP; ++c) {
    packet kp[4];
    for (int u = 0; u < 4; ++u) kp[u] = load_shared(k + u * ldk + c * lanes);
    for (int t = 0; t < 2; ++t)
      for (int u = 0; u < 4; ++u) acc[t * 4 + u] = ei::pmadd(qv[t][c], kp[u], acc[t * 4 + u]);
  }
  finish_eight<2, 4>(acc, q, k, ldk, dp, d, s, j);
}

/// s[t][j] = q[t] . k_j for two rows and the keys j in [jb, je) (a multiple of 4 of them),
/// the rows' NP packets in registers; pace() before every four keys.
template <int NP, class T, class Pace>
void scores_pair(const float* const* q, const T* k, index_t ldk, index_t jb, index_t je, index_t d,
                 float* const* s, Pace&& pace) {
  namespace ei = Eigen::internal;
  packet qv[2][NP];
  for (int t = 0; t < 2; ++t)
    for (int c = 0; c < NP; ++c) qv[t][c] = ei::ploadu<packet>(q[t] + c * lanes);
  for (index_t j = jb; j < je; j += 4) {
    pace();
    dot_pair4<NP>(qv, q, k + j * ldk, ldk, d, s, j);
  }
}

/// Rows two at a time with their packets in registers, over
/// blocks of 16 KiB of K rows so that every pair after the first reads them from L1.
/// Returns the rows done.
template <int NP, class T, class Pace>
index_t scores_pairs(const float* const* q, index_t m, const T* k, index_t ldk, index_t bk,
                     index_t d, float* const* s, Pace&& pace) {
  const index_t pairs = m / 2, whole = bk / 4 * 4;
  const index_t block =
      std::max<index_t>(4, l1_block_keys(d * static_cast<index_t>(sizeof(T)) / 4) / 4 * 4);
  for (index_t jb = 0; jb < whole; jb += block) {
    const index_t je = std::min(whole, jb + block);
    for (index_t p = 0; p < pairs; ++p)
      scores_pair<NP>(q + 2 * p, k, ldk, jb, je, d, s + 2 * p, pace);
  }
  // The last keys (fewer than 4) through the general blocks, one row at a time.
  for (index_t j = whole; j < bk; ++j) {
    pace();
    const T* kr[1] = {k + j * ldk};
    for (index_t t = 0; t < 2 * pairs; ++t) dot_block<1, 1>(q + t, kr, d, s + t, j);
  }
  return 2 * pairs;
}
/// s[t][j] = q[t] . k_j for four rows and the keys j in [jb, je) (an even number of them),
/// each K packet loaded (and widened) once for the four rows, two keys at a time. The four
/// rows' packets do not all fit in registers with D 128, so the head dimension goes in
/// phases of four packets: a phase holds the rows' four packets in registers over a block of
/// keys and leaves each (row, key) accumulator in a small spill buffer for the next phase.
/// The same arithmetic in the same order as dot_block and dot_pair4 (packets in ascending
/// order into one accumulator per pair, eight_sums, then the scalar tail), so the results
/// are bitwise theirs. pace() before every two keys of each phase.
template <int NP, class T, class Pace>
void scores_quad(const float* const* q, const T* k, index_t ldk, index_t jb, index_t je, index_t d,
                 float* const* s, Pace&& pace) {
  namespace ei = Eigen::internal;
  static_assert(NP % 4 == 0, "phases of four packets");
  constexpr int phases = NP / 4;
  constexpr index_t block = 32;  // keys per block: an 8 KiB spill buffer
  constexpr index_t dp = NP * lanes;
  packet spill[block / 2][8];
  for (index_t j0 = jb; j0 < je; j0 += block) {
    const index_t j1 = std::min(je, j0 + block);
    for (int ph = 0; ph < phases; ++ph) {
      packet qv[4][4];
      for (int t = 0; t < 4; ++t)
        for (int c = 0; c < 4; ++c) qv[t][c] = ei::ploadu<packet>(q[t] + (4 * ph + c) * lanes);
      for (index_t j = j0; j < j1; j += 2) {
        pace();
        packet* const sp = spill[(j - j0) / 2];
        packet acc[8];
        for (int i = 0; i < 8; ++i) acc[i] = ph == 0 ? ei::pset1<packet>(0.0f) : sp[i];
        const T* const kj = k + j * ldk + 4 * ph * lanes;
        for (int c = 0; c < 4; ++c) {
          const packet k0 = load_shared(kj + c * lanes), k1 = load_shared(kj + ldk + c * lanes);
          for (int t = 0; t < 4; ++t) {
            acc[2 * t] = ei::pmadd(qv[t][c], k0, acc[2 * t]);
            acc[2 * t + 1] = ei::pmadd(qv[t][c], k1, acc[2 * t + 1]);
          }
        }
        if (ph + 1 < phases)
          for (int i = 0; i < 8; ++i) sp[i] = acc[i];
        else
          finish_eight<4, 2>(acc, q, k + j * ldk, ldk, dp, d, s, j);
      }
    }
  }
}

/// Rows four at a time (scores_quad), then the rest in pairs. Returns the rows done.
template <int NP, class T, class Pace>
index_t scores_quads(const float* const* q, index_t m, const T* k, index_t ldk, index_t bk,
                     index_t d, float* const* s, Pace&& pace) {
  const index_t quads = m / 4, whole = bk / 2 * 2;
  for (index_t g = 0; g < quads; ++g) {
    scores_quad<NP>(q + 4 * g, k, ldk, 0, whole, d, s + 4 * g, pace);
    for (index_t j = whole; j < bk; ++j) {
      pace();
      const T* kr[1] = {k + j * ldk};
      for (index_t t = 4 * g; t < 4 * g + 4; ++t) dot_block<1, 1>(q + t, kr, d, s + t, j);
    }
  }
  index_t t = 4 * quads;
  if (m - t >= 2) t += scores_pairs<NP>(q + t, m - t, k, ldk, bk, d, s + t, pace);
  return t;
}
#endif

/// s[t][j] = q[t] . k_j for R rows and the keys j < bk (row j at k + j * ldk), J keys at a
/// time; pace() before every J keys.
template <int R, int J, class T, class Pace>
void scores_rows(const float* const* q, const T* k, index_t ldk, index_t bk, index_t d,
                 float* const* s, Pace&& pace) {
  index_t j = 0;
  for (; j + J <= bk; j += J) {
    pace();
    const T* kr[J];
    for (int u = 0; u < J; ++u) kr[u] = k + (j + u) * ldk;
    dot_block<R, J>(q, kr, d, s, j);
  }
  for (; j < bk; ++j) {
    pace();
    const T* kr[1] = {k + j * ldk};
    dot_block<R, 1>(q, kr, d, s, j);
  }
}

/// s[t][j] = q[t] . k_j for the rows t < m (q[t]: d floats) and the keys j < bk of a key
/// tile (row j at k + j * ldk, stored as T). pace() is called before each step of the
/// products over a few keys of a block of rows (one key: 8 to 32 packet FMAs at D = 128):
/// the caller requests memory at that pace meanwhile (paced_prefetch).
template <class T, class Pace>
void small_scores(const float* const* q, index_t m, const T* k, index_t ldk, index_t bk, index_t d,
                  float* const* s, Pace&& pace) {
  // Blocks of 4, 2 and 1 rows, with 2, 4 and 8 keys at a time: 8 chains each (16, with
  // 4 keys for 4 rows, were no faster with AVX-512).
  index_t t = 0;
#if defined(EIGEN_VECTORIZE_AVX512)
  // Two rows or more (a GQA group, several query tokens) with a head dimension of 4 or 8
  // whole packets (and any tail): pairs of rows with their packets in registers instead. The
  // loop then loads only K; the 4-row blocks load a row's packet for every two keys.
  // With fp32 K, D of 8 whole packets and four rows or more, the rows go four at a time
  // (scores_quad: each K packet loaded once for four rows). Not with half-precision K: a
  // little faster on a tile in L1, but slower in decode steps. Measurements of these
  // blockings: docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: small_scores".
  if (std::is_same<T, float>::value && m >= 4 && d / lanes == 8)
    t = scores_quads<8>(q, m, k, ldk, bk, d, s, pace);
  else if (m >= 2 && d / lanes == 8)
    t = scores_pairs<8>(q, m, k, ldk, bk, d, s, pace);
  else if (m >= 2 && d / lanes == 4)
    t = scores_pairs<4>(q, m, k, ldk, bk, d, s, pace);
#endif
  for (; t + 4 <= m; t += 4) scores_rows<4, 2>(q + t, k, ldk, bk, d, s + t, pace);
  for (; t + 2 <= m; t += 2) scores_rows<2, 4>(q + t, k, ldk, bk, d, s + t, pace);
  for (; t < m; ++t) scores_rows<1, 8>(q + t, k, ldk, bk, d, s + t, pace);
}

/// y[t * ldy + j] = x[t] . w_j, or += with `accumulate`, for the rows t < m of x (x[t] at
/// x + t * ldx) and the rows j < n of w (w_j at w + j * ldw), d elements each: a projection
/// of a few tokens (a decoding step's rows, a few speculative tokens, a small batch) through
/// the dot products of small_scores, with each element summed in its own order (so a row's
/// results are bitwise the same whatever m and the blocking).
///
/// Eight rows of w at a time, and the rows of x two at a time over them (16 chains): the
/// eight rows are eight runs read from memory side by side, and stay in L1 for the other
/// pairs. Why eight: each row of w is a run of its own (4 KiB for d = 1024 fp32: a page,
/// which the hardware prefetcher must pick up anew), and the weights stream about as fast as
/// the runs read at once allow: this blocking read the weights faster than small_scores'
/// (2 rows of x against 4 rows of w), than each row of x alone against 8 rows of w, and than
/// Eigen's GEMM (docs/journal/2026-12-design-measurements.md,
/// "host/small_rows.hpp: few_rows_products").
/// With 16 vector registers (AVX2) the pairs go against 4 rows of w (below).
template <class T>
void few_rows_products(const float* x, index_t ldx, index_t m, const T* w, index_t ldw, index_t n,
                       index_t d, float* y, index_t ldy, bool accumulate) {
  // Pairs of rows hold 2 x pair_keys accumulators and pair_keys rows of w in registers (25
  // vectors with 8): with 16 vector registers (AVX2), 4 rows of w at a time (with 8, 16 rows
  // of x went slower than Eigen's product, with 4 faster;
  // docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: few_rows_products").
  constexpr index_t keys = 8, pair_keys = vector_registers >= 32 ? 8 : 4;
  const auto unpaced = [] {};
  for (index_t j = 0; j < n; j += keys) {
    const index_t nj = std::min(keys, n - j);
    const T* wj = w + j * ldw;
    for (index_t t = 0; t < m; t += 2) {
      const float* q[2] = {x + t * ldx, x + std::min(t + 1, m - 1) * ldx};
      alignas(32) float part[2][keys];
      float* s[2] = {part[0], part[1]};
      if (t + 1 < m)
        scores_rows<2, pair_keys>(q, wj, ldw, nj, d, s, unpaced);
      else
        scores_rows<1, keys>(q, wj, ldw, nj, d, s, unpaced);
      for (index_t r = t; r < std::min(t + 2, m); ++r) {
        float* yr = y + r * ldy + j;
        for (index_t u = 0; u < nj; ++u)
          yr[u] = accumulate ? yr[u] + part[r - t][u] : part[r - t][u];
      }
    }
  }
}

/// The accumulators of R rows over the NB blocks from block u of a tile of K in blocks
/// (key_blocks.hpp; block u at k + u * ldk, a row-major (d, 16) matrix): acc[t * C + c],
/// C = NB * 16 / lanes, holds the scores of row t and keys 16 u + c lanes .. (the tile's
/// keys less the lane of its first key). Each block's 16 scores of a row are the lanes of
/// 16 / lanes packets: element e of the 16 keys, one contiguous run, times q[t][e]
/// broadcast, elements in ascending order. So a score is a chain of FMAs over e that
/// depends on nothing but its own row and key (not on R, NB or the rows beside it), there
/// are no horizontal sums, and each K packet is loaded (and widened) once for all R rows.
/// pace() before every 8 elements (every 16, with the schedule paced_prefetch had before
/// its ticks became a fixed count of requests, was slower on decode steps;
/// docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: block_products").
template <int R, int NB, class T, class Pace>
ALIBI_FORCEINLINE void block_products(const float* const* q, const T* k, index_t ldk, index_t u,
                                      index_t d, packet* acc, Pace& pace) {
  namespace ei = Eigen::internal;
  constexpr int P = static_cast<int>(keys_per_block / lanes), C = NB * P;
  for (int i = 0; i < R * C; ++i) acc[i] = ei::pset1<packet>(0.0f);
  const T* kp[NB];
  for (int i = 0; i < NB; ++i) kp[i] = k + (u + i) * ldk;
  for (index_t e = 0; e < d; ++e) {
    if (e % 8 == 0) pace();
    packet x[C];
    for (int i = 0; i < NB; ++i)
      for (int c = 0; c < P; ++c)
        x[i * P + c] = R > 1 ? load_shared(kp[i] + e * keys_per_block + c * lanes)
                             : load_floats(kp[i] + e * keys_per_block + c * lanes);
    for (int t = 0; t < R; ++t) {
      const packet qe = ei::pset1<packet>(q[t][e]);
      for (int c = 0; c < C; ++c) acc[t * C + c] = ei::pmadd(qe, x[c], acc[t * C + c]);
    }
  }
}

/// s[t][r] = q[t] . k_r for R rows and the tile's keys r in the blocks [u, u_end), all of
/// whose lanes are keys of the tile (r = 16 u + i - off in [0, bk)): NB blocks at a time,
/// then NB / 2, NB / 4, ... at a time.
template <int R, int NB, class T, class Pace>
void whole_block_scores(const float* const* q, const T* k, index_t ldk, index_t u, index_t u_end,
                        index_t off, index_t d, float* const* s, Pace& pace) {
  static_assert((NB & (NB - 1)) == 0, "blocks at a time: a power of 2");
  constexpr int C = NB * static_cast<int>(keys_per_block / lanes);
  for (; u + NB <= u_end; u += NB) {
    packet acc[R * C];
    block_products<R, NB>(q, k, ldk, u, d, acc, pace);
    const index_t r0 = u * keys_per_block - off;
    for (int t = 0; t < R; ++t)
      for (int c = 0; c < C; ++c) Eigen::internal::pstoreu(s[t] + r0 + c * lanes, acc[t * C + c]);
  }
  if constexpr (NB > 1) whole_block_scores<R, NB / 2>(q, k, ldk, u, u_end, off, d, s, pace);
}

/// whole_block_scores for one block at an edge of the tile: only its lanes that are keys of
/// the tile are stored. A function of its own: storing part of a packet through a local
/// array in the function of the whole blocks made GCC keep their accumulators in memory
/// (docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: edge_block_scores").
template <int R, class T, class Pace>
__attribute__((noinline)) void edge_block_scores(const float* const* q, const T* k, index_t ldk,
                                                 index_t u, index_t off, index_t bk, index_t d,
                                                 float* const* s, Pace& pace) {
  constexpr int C = static_cast<int>(keys_per_block / lanes);
  packet acc[R * C];
  block_products<R, 1>(q, k, ldk, u, d, acc, pace);
  const index_t r0 = u * keys_per_block - off;
  for (int t = 0; t < R; ++t) {
    alignas(64) float all[keys_per_block];
    for (int c = 0; c < C; ++c) Eigen::internal::pstore(all + c * lanes, acc[t * C + c]);
    for (index_t i = std::max<index_t>(0, -r0); i < keys_per_block && r0 + i < bk; ++i)
      s[t][r0 + i] = all[i];
  }
}

/// s[t][r] = q[t] . k_r for R rows and the keys r < bk of a tile of K in blocks whose first
/// key is lane off of block 0: the edge blocks alone, the whole ones NB at a time.
template <int R, int NB, class T, class Pace>
void block_scores_rows(const float* const* q, const T* k, index_t ldk, index_t off, index_t bk,
                       index_t d, float* const* s, Pace& pace) {
  const index_t blocks = key_block_count(off + bk);
  const index_t first = off == 0 ? 0 : 1;                            // the first whole block
  const index_t end = std::max(first, (off + bk) / keys_per_block);  // past the last one
  if (first == 1) edge_block_scores<R>(q, k, ldk, 0, off, bk, d, s, pace);
  whole_block_scores<R, NB>(q, k, ldk, first, end, off, d, s, pace);
  if (end < blocks) edge_block_scores<R>(q, k, ldk, end, off, bk, d, s, pace);
}

/// small_scores for K in blocks (k: the block holding the tile's first key, at lane off;
/// block u at k + u * ldk): rows 4, 2 or 1 at a time, with as many blocks at a time as make
/// about half the vector registers of accumulators (each a chain over the head dimension).
/// Faster than small_scores over the same keys stored as rows, in fp16, bf16 and fp32
/// (docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: small_block_scores").
template <class T, class Pace>
void small_block_scores(const float* const* q, index_t m, const T* k, index_t ldk, index_t off,
                        index_t bk, index_t d, float* const* s, Pace&& pace) {
  constexpr int P = static_cast<int>(keys_per_block / lanes);
  constexpr int chains = vector_registers / 2;
  constexpr int nb4 = std::clamp(chains / (4 * P), 1, 8), nb2 = std::clamp(chains / (2 * P), 1, 8),
                nb1 = std::clamp(chains / P, 1, 8);
  index_t t = 0;
  for (; t + 4 <= m; t += 4) block_scores_rows<4, nb4>(q + t, k, ldk, off, bk, d, s + t, pace);
  for (; t + 2 <= m; t += 2) block_scores_rows<2, nb2>(q + t, k, ldk, off, bk, d, s + t, pace);
  for (; t < m; ++t) block_scores_rows<1, nb1>(q + t, k, ldk, off, bk, d, s + t, pace);
}

/// o[t][c * lanes, (c + C) * lanes) += sum over keys j in [jb, je) of p[t][j] v_j for R rows:
/// the R x C packets of o stay in registers while the keys go by in ascending order (v_j at
/// v + j * ldv, stored as T), and each V packet is loaded (and widened) once for all R rows.
/// Each key's R x C products are independent, so the FMA units stay busy even though every
/// packet's own sum is a chain over the keys. pace() before every key (a tick every 4 keys,
/// so requests 4 times larger, saved arithmetic but made fp16 MHA decode steps slower on one
/// thread; docs/journal/2026-12-design-measurements.md, "host/small_rows.hpp: pv_packets").
template <int R, int C, class T, class Pace>
ALIBI_FORCEINLINE void pv_packets(const float* const* p, const T* v, index_t ldv, index_t jb,
                                  index_t je, float* const* o, Pace& pace) {
  namespace ei = Eigen::internal;
  packet acc[R][C];
  for (int t = 0; t < R; ++t)
    for (int c = 0; c < C; ++c) acc[t][c] = ei::ploadu<packet>(o[t] + c * lanes);
  for (index_t j = jb; j < je; ++j) {
    pace();
    const T* vj = v + j * ldv;
    packet vp[C];
    for (int c = 0; c < C; ++c)
      vp[c] = R > 1 ? load_shared(vj + c * lanes) : load_floats(vj + c * lanes);
    for (int t = 0; t < R; ++t) {
      const packet w = ei::pset1<packet>(p[t][j]);
      for (int c = 0; c < C; ++c) acc[t][c] = ei::pmadd(w, vp[c], acc[t][c]);
    }
  }
  for (int t = 0; t < R; ++t)
    for (int c = 0; c < C; ++c) ei::pstoreu(o[t] + c * lanes, acc[t][c]);
}

/// The packets [e, dp) of R output rows (e advanced past them): blocks of C packets while
/// they fit, then of C / 2, ..., 1, so that every block keeps several independent chains.
template <int R, int C, class T, class Pace>
ALIBI_FORCEINLINE void pv_blocks(const float* const* p, const T* v, index_t ldv, index_t jb,
                                 index_t je, index_t dp, float* const* o, index_t& e, Pace& pace) {
  float* oe[R];
  for (; e + C * lanes <= dp; e += C * lanes) {
    for (int t = 0; t < R; ++t) oe[t] = o[t] + e;
    pv_packets<R, C>(p, v + e, ldv, jb, je, oe, pace);
  }
  if constexpr (C > 1) pv_blocks<R, C / 2>(p, v, ldv, jb, je, dp, o, e, pace);
}

/// o[t][e] += sum over keys j in [jb, je) of p[t][j] v_j[e] for R rows, keys in ascending
/// order (v_j at v + j * ldv, dv elements): as many packets of the rows at a time as half
/// the vector registers hold (at most 8 per row: a whole row for head dims up to 128 with
/// AVX-512 and one row), fewer for what is left, then the scalar tail. A V row is read front
/// to back for each group of packets, in ascending keys: one contiguous run the hardware
/// prefetcher follows.
template <int R, class T, class Pace>
void pv_rows(const float* const* p, const T* v, index_t ldv, index_t jb, index_t je, index_t dv,
             float* const* o, Pace& pace) {
  constexpr int C = vector_registers / 2 / R >= 8 ? 8 : vector_registers / 2 / R >= 4 ? 4 : 2;
  const index_t dp = dv / lanes * lanes;
  index_t e = 0;
  pv_blocks<R, C>(p, v, ldv, jb, je, dp, o, e, pace);
  // The scalar tail through std::fma: a compiler may contract a += p * v into one FMA in
  // one instantiation of this function and not in another (seen with GCC 12: the tail of
  // D 120 differed between two callers), and a row's result must not depend on its caller.
  for (int t = 0; t < R; ++t)
    for (e = dp; e < dv; ++e) {
      float a = o[t][e];
      for (index_t j = jb; j < je; ++j)
        a = std::fma(p[t][j], static_cast<float>(v[j * ldv + e]), a);
      o[t][e] = a;
    }
}

/// o[t] += sum over keys j < bk not listed in skip[0, nskip) (ascending) of p[t][j] v_j, for
/// the rows t < m (o[t]: dv floats; v_j stored as T). Each output element sums its keys in
/// ascending order, whatever the blocking. pace() is called before every key of each block
/// of rows and packets, as small_scores calls it.
template <class T, class Pace>
void small_pv(const float* const* p, index_t m, const T* v, index_t ldv, index_t bk, index_t dv,
              const index_t* skip, index_t nskip, float* const* o, Pace&& pace) {
  // Keys in blocks of at most 16 KiB of fp32 V rows, and within a block the rows 4, 2 or 1
  // at a time: each V packet is loaded once per block of rows, and the block's V rows, read
  // from memory for the first packets, are still in L1 for the next ones. Each output
  // element still sums its keys in ascending order.
  const index_t block = l1_block_keys(dv);
  for (index_t u = 0, jb = 0; u <= nskip; ++u) {
    const index_t je = u < nskip ? skip[u] : bk;
    for (index_t j = jb; j < je; j += block) {
      const index_t jend = std::min(je, j + block);
      index_t t = 0;
      for (; t + 4 <= m; t += 4) pv_rows<4>(p + t, v, ldv, j, jend, dv, o + t, pace);
      for (; t + 2 <= m; t += 2) pv_rows<2>(p + t, v, ldv, j, jend, dv, o + t, pace);
      for (; t < m; ++t) pv_rows<1>(p + t, v, ldv, j, jend, dv, o + t, pace);
    }
    jb = je + 1;
  }
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
