// SPDX-License-Identifier: MIT
// The softmax passes of the fused CPU kernel over one score tile, written with Eigen's
// packet primitives so that they use the widest vectors Eigen was compiled for (16 floats
// with AVX-512) whatever the compiler's auto-vectorization preferences.
//
// The tile is column-major: column j holds the scores of key j for the tile's query rows,
// so every per-row quantity (running max, sum, bias base) is a vector across rows and the
// passes need no horizontal reductions. Rows are processed in whole packets: the row count
// is padded to a multiple of the packet size and padding rows are masked to -inf.
//
// Scores are in base-2 units (detail/online_softmax.hpp): callers pass scale * log2(e) and
// -slope * log2(e) as `scale` and `neg_slope`, and the exponentials are powers of two.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/core/bias.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/numerics/online_softmax.hpp"

namespace alibi {
namespace detail {
namespace cpu {
// Code whose instructions depend on the compiler's target flags lives in an inline
// namespace named after the instruction set (config.hpp): two translation units built with
// different -march flags then emit differently named symbols instead of one weak symbol
// that the linker would pick from either (and run AVX-512 code on a CPU without it).
inline namespace ALIBI_CPU_ISA {

// Packet types are vector types with alignment attributes; naming them as template
// arguments draws GCC's -Wignored-attributes, which Eigen silences in its own headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"
#endif
using packet = Eigen::internal::packet_traits<float>::type;
inline constexpr int lanes = Eigen::internal::unpacket_traits<packet>::size;

/// Packets of K or V elements: `lanes` stored values from p (any alignment) as floats, so
/// that the products widen half precision in registers and no converted copy is written.
/// fp16 goes through F16C's vcvtph2ps where the target has it (called directly: Eigen 3.4
/// enables its own F16C path only under clang, and falls back to a scalar emulation under
/// GCC), bfloat16 through Eigen's packet cast (a 16-bit shift) where Eigen vectorizes it at
/// this packet width, int8 (ragged attention's 8-bit K/V, scales applied by the caller)
/// through a sign extension with AVX2 or AVX-512, and anything else element by element.
/// Every path is exact, so the
/// products see the same floats whichever runs (signalling NaNs may come out quieted).
template <class T>
ALIBI_FORCEINLINE packet load_floats(const T* p) {
  namespace ei = Eigen::internal;
  if constexpr (std::is_same<T, float>::value) {
    return ei::ploadu<packet>(p);
  } else if constexpr (std::is_same<T, std::int8_t>::value) {
    // int8 K/V (ragged attention's 8-bit pages): sign-extended to int32, then converted.
#if defined(EIGEN_VECTORIZE_AVX512)
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(EIGEN_VECTORIZE_AVX2)
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
    alignas(64) float wide[lanes];
    for (int i = 0; i < lanes; ++i) wide[i] = static_cast<float>(p[i]);
    return ei::pload<packet>(wide);
#endif
  } else {
#if defined(__F16C__) && defined(EIGEN_VECTORIZE_AVX512)
    if constexpr (std::is_same<T, Eigen::half>::value)
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && defined(EIGEN_VECTORIZE_AVX)
    if constexpr (std::is_same<T, Eigen::half>::value)
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
    using stored = typename ei::packet_traits<T>::type;
    if constexpr (std::is_same<T, Eigen::bfloat16>::value && ei::packet_traits<T>::Vectorizable &&
                  ei::unpacket_traits<stored>::size == lanes && lanes > 1) {
      return ei::pcast<stored, packet>(ei::ploadu<stored>(p));
    } else {
      alignas(64) float wide[lanes];
      for (int i = 0; i < lanes; ++i) wide[i] = static_cast<float>(p[i]);
      return ei::pload<packet>(wide);
    }
  }
}

/// load_floats for a packet that several query rows use, kept in a register. With fp32, GCC
/// 12 folds such a load into each row's FMA as a memory operand instead (it counts those
/// loads as free), so P V then issues more loads than FMAs and runs well below the same loop
/// over fp16 V. An empty asm statement that claims to modify the register makes the compiler
/// load it once; no effect on the arithmetic. Half precision is widened into a register
/// anyway, and the statement there made GCC store each packet to the stack, which slowed P V
/// (docs/journal/2026-12-design-measurements.md, "host/simd.hpp: load_shared").
template <class T>
ALIBI_FORCEINLINE packet load_shared(const T* p) {
  packet x = load_floats(p);
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  if constexpr (std::is_same<T, float>::value) asm("" : "+v"(x));
#endif
  return x;
}

/// Rows rounded up to whole packets.
inline index_t packet_rows(index_t m) { return (m + lanes - 1) / lanes * lanes; }

/// The positional layout of one tile. Local row t is query row ra + t of the item; column j
/// is key j0 + j. Valid rows of column j: [c0[j], c1[j]) (empty for an excluded key).
struct tile_geometry {
  index_t rows = 0;              // m, valid local rows
  index_t cols = 0;              // bk
  const float* base = nullptr;   // (rows) q_pos - k_pos of key 0, exact integers (< 2^24)
  const float* shift = nullptr;  // (rows) the row's distance shift, exact integers
  const index_t* c0 = nullptr;   // (cols)
  const index_t* c1 = nullptr;   // (cols)
};

#if defined(EIGEN_VECTORIZE)
using int_packet = typename Eigen::internal::unpacket_traits<packet>::integer_packet;
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#if defined(EIGEN_VECTORIZE)

/// 2^x on a packet, for softmax arguments x <= 0, flushed to 0 below exp2_flush_threshold
/// (see there for the why). x = n + r with n = round(x) and |r| <= 1/2; 2^r = e^t with
/// t = r ln2, |t| <= 0.347, by its degree-6 Taylor polynomial (truncation error t^7/7! <
/// 1.3e-7 relative, about one ulp); 2^n is built in the exponent bits. -inf (masked scores)
/// gives exactly 0; NaN propagates.
ALIBI_FORCEINLINE packet exp2_packet(const packet& x) {
  namespace ei = Eigen::internal;
  const packet threshold = ei::pset1<packet>(exp2_flush_threshold);
  // 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer (ties to even),
  // and leaves that integer in the low mantissa bits.
  const packet magic = ei::pset1<packet>(12582912.0f);
  // pmax returns its first argument when either is NaN, so a NaN x stays NaN here; the
  // clamp keeps n in the exponent's range.
  const packet xc = ei::pmax(x, threshold);
  const packet z = ei::padd(xc, magic);
  const packet n = ei::psub(z, magic);
  const packet t = ei::pmul(ei::psub(xc, n), ei::pset1<packet>(ln2_f));
  packet p = ei::pset1<packet>(1.0f / 720.0f);
  p = ei::pmadd(p, t, ei::pset1<packet>(1.0f / 120.0f));
  p = ei::pmadd(p, t, ei::pset1<packet>(1.0f / 24.0f));
  p = ei::pmadd(p, t, ei::pset1<packet>(1.0f / 6.0f));
  p = ei::pmadd(p, t, ei::pset1<packet>(0.5f));
  p = ei::pmadd(p, t, ei::pset1<packet>(1.0f));
  p = ei::pmadd(p, t, ei::pset1<packet>(1.0f));
  // n sits in z's low mantissa bits: add the exponent bias and shift it into place (for a
  // NaN x the bits are garbage and the result is NaN either way).
  const int_packet e = ei::plogical_shift_left<23>(ei::padd(
      ei::psub(ei::preinterpret<int_packet>(z), ei::pset1<int_packet>(float_to_bits(12582912.0f))),
      ei::pset1<int_packet>(127)));
  const packet y = ei::pmul(p, ei::preinterpret<packet>(e));
  // x < threshold covers -inf: masked keys give exactly 0.
  return ei::pselect(ei::pcmp_lt(x, threshold), ei::pzero(x), y);
}

/// x[j] = 2^(x[j] - m) for the n < lanes elements of a row's tail, through one padded
/// packet (so that the tail is computed by the same polynomial); returns their sum.
inline float exp2_tail(float* x, index_t n, float m) {
  namespace ei = Eigen::internal;
  alignas(64) float buf[lanes];
  for (int t = 0; t < lanes; ++t) buf[t] = t < n ? x[t] : -std::numeric_limits<float>::infinity();
  ei::pstore(buf, exp2_packet(ei::psub(ei::pload<packet>(buf), ei::pset1<packet>(m))));
  float sum = 0.0f;
  for (index_t t = 0; t < n; ++t) sum += (x[t] = buf[t]);
  return sum;
}

/// Pass 1 (the score tile): x(t, j) = scale * s(t, j) + neg_slope * (|base_t - j| - shift_t) on
/// valid rows,
/// -inf elsewhere; mx[t] = max over j. s is column-major with column stride lds and at
/// least packet_rows(rows) rows.
inline void score_tile(float* s, index_t lds, const tile_geometry& g, float scale, float neg_slope,
                       float* mx) {
  namespace ei = Eigen::internal;
  const packet vscale = ei::pset1<packet>(scale), vslope = ei::pset1<packet>(neg_slope);
  const packet neg_inf = ei::pset1<packet>(-std::numeric_limits<float>::infinity());
  const index_t mp = packet_rows(g.rows);
  for (index_t t0 = 0; t0 < mp; t0 += lanes) {
    // Padding rows (t >= rows) read base/shift of 0 through the masked load below.
    const packet base = ei::ploadu<packet>(g.base + t0), shift = ei::ploadu<packet>(g.shift + t0);
    const packet rows = ei::plset<packet>(static_cast<float>(t0));
    packet vmax = neg_inf;
    for (index_t j = 0; j < g.cols; ++j) {
      float* col = s + j * lds + t0;
      const index_t c0 = g.c0[j], c1 = g.c1[j];
      if (c1 <= t0 || c0 >= t0 + lanes || c0 >= c1) {
        ei::pstoreu(col, neg_inf);
        continue;
      }
      const packet dist =
          ei::psub(ei::pabs(ei::psub(base, ei::pset1<packet>(static_cast<float>(j)))), shift);
      packet x = ei::pmadd(vscale, ei::ploadu<packet>(col), ei::pmul(vslope, dist));
      if (c0 > t0 || c1 < t0 + lanes) {
        const packet valid = ei::pand(ei::pcmp_le(ei::pset1<packet>(static_cast<float>(c0)), rows),
                                      ei::pcmp_lt(rows, ei::pset1<packet>(static_cast<float>(c1))));
        x = ei::pselect(valid, x, neg_inf);
      }
      ei::pstoreu(col, x);
      vmax = ei::pmax(x, vmax);
    }
    ei::pstoreu(mx + t0, vmax);
  }
}

/// Pass 2: p(t, j) = 2^(x(t, j) - m_use[t]) in place; lsum[t] = sum over j.
inline void exp_tile(float* s, index_t lds, index_t rows, index_t cols, const float* m_use,
                     float* lsum) {
  namespace ei = Eigen::internal;
  const index_t mp = packet_rows(rows);
  for (index_t t0 = 0; t0 < mp; t0 += lanes) {
    const packet m = ei::ploadu<packet>(m_use + t0);
    packet acc0 = ei::pzero(m), acc1 = acc0;
    index_t j = 0;
    for (; j + 2 <= cols; j += 2) {
      float* c0 = s + j * lds + t0;
      float* c1 = c0 + lds;
      const packet p0 = exp2_packet(ei::psub(ei::ploadu<packet>(c0), m));
      const packet p1 = exp2_packet(ei::psub(ei::ploadu<packet>(c1), m));
      ei::pstoreu(c0, p0);
      ei::pstoreu(c1, p1);
      acc0 = ei::padd(acc0, p0);
      acc1 = ei::padd(acc1, p1);
    }
    for (; j < cols; ++j) {
      float* c0 = s + j * lds + t0;
      const packet p0 = exp2_packet(ei::psub(ei::ploadu<packet>(c0), m));
      ei::pstoreu(c0, p0);
      acc0 = ei::padd(acc0, p0);
    }
    ei::pstoreu(lsum + t0, ei::padd(acc0, acc1));
  }
}

/// Row layout, for tiles of fewer rows than a packet (decoding): one query row x[0, n) of
/// keys, vectorized across keys. x[j] = scale * x[j] + neg_slope * (|base - j| - shift) for
/// j in [vb, ve), -inf elsewhere; returns the row maximum.
inline float score_row(float* x, index_t n, index_t vb, index_t ve, float scale, float neg_slope,
                       float base, float shift) {
  namespace ei = Eigen::internal;
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  std::fill(x, x + vb, neg_inf);
  std::fill(x + ve, x + n, neg_inf);
  const packet vscale = ei::pset1<packet>(scale), vslope = ei::pset1<packet>(neg_slope);
  const packet vshift = ei::pset1<packet>(shift), vbase = ei::pset1<packet>(base);
  packet vmax = ei::pset1<packet>(neg_inf);
  index_t j = vb;
  for (; j + lanes <= ve; j += lanes) {
    const packet dist =
        ei::psub(ei::pabs(ei::psub(vbase, ei::plset<packet>(static_cast<float>(j)))), vshift);
    const packet v = ei::pmadd(vscale, ei::ploadu<packet>(x + j), ei::pmul(vslope, dist));
    ei::pstoreu(x + j, v);
    vmax = ei::pmax(v, vmax);
  }
  float mx = ei::predux_max(vmax);
  for (; j < ve; ++j) {
    x[j] = scale * x[j] + neg_slope * (std::fabs(base - static_cast<float>(j)) - shift);
    mx = max_keep_nan(mx, x[j]);
  }
  return mx;
}

/// Row layout: x[j] = 2^(x[j] - m) for j in [0, n); returns the sum.
inline float exp_row(float* x, index_t n, float m) {
  namespace ei = Eigen::internal;
  const packet vm = ei::pset1<packet>(m);
  packet acc = ei::pzero(vm);
  index_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    const packet p = exp2_packet(ei::psub(ei::ploadu<packet>(x + j), vm));
    ei::pstoreu(x + j, p);
    acc = ei::padd(acc, p);
  }
  return ei::predux(acc) + (j < n ? exp2_tail(x + j, n - j, m) : 0.0f);
}

#else  // no SIMD: the same passes one element at a time

inline void score_tile(float* s, index_t lds, const tile_geometry& g, float scale, float neg_slope,
                       float* mx) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  for (index_t t = 0; t < g.rows; ++t) mx[t] = neg_inf;
  for (index_t j = 0; j < g.cols; ++j)
    for (index_t t = 0; t < g.rows; ++t) {
      float& x = s[j * lds + t];
      if (t < g.c0[j] || t >= g.c1[j]) {
        x = neg_inf;
        continue;
      }
      x = scale * x + neg_slope * (std::fabs(g.base[t] - static_cast<float>(j)) - g.shift[t]);
      mx[t] = max_keep_nan(mx[t], x);
    }
}

inline void exp_tile(float* s, index_t lds, index_t rows, index_t cols, const float* m_use,
                     float* lsum) {
  for (index_t t = 0; t < rows; ++t) lsum[t] = 0.0f;
  for (index_t j = 0; j < cols; ++j)
    for (index_t t = 0; t < rows; ++t) {
      float& x = s[j * lds + t];
      x = exp2_flush(x - m_use[t]);
      lsum[t] += x;
    }
}

inline float score_row(float* x, index_t n, index_t vb, index_t ve, float scale, float neg_slope,
                       float base, float shift) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  float mx = neg_inf;
  for (index_t j = 0; j < n; ++j) {
    if (j < vb || j >= ve) {
      x[j] = neg_inf;
      continue;
    }
    x[j] = scale * x[j] + neg_slope * (std::fabs(base - static_cast<float>(j)) - shift);
    mx = max_keep_nan(mx, x[j]);
  }
  return mx;
}

inline float exp_row(float* x, index_t n, float m) {
  float sum = 0.0f;
  for (index_t j = 0; j < n; ++j) sum += (x[j] = exp2_flush(x[j] - m));
  return sum;
}

#endif

/// Pass 1 for tiles whose distances reach 2^24 (positions far apart): the bias per element
/// from the 64-bit distance. Rare; scalar.
/// Element (t, j) is s[t * row_stride + j * col_stride], so it serves both layouts.
inline void score_tile_far(float* s, index_t row_stride, index_t col_stride, const tile_geometry& g,
                           float scale, float slope, index_t q_pos0, index_t k_pos0,
                           const index_t* shift, float* mx) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  const index_t mp = packet_rows(g.rows);
  for (index_t t = 0; t < mp; ++t) mx[t] = neg_inf;
  for (index_t j = 0; j < g.cols; ++j)
    for (index_t t = 0; t < mp; ++t) {
      float& x = s[t * row_stride + j * col_stride];
      if (t < g.c0[j] || t >= g.c1[j]) {
        x = neg_inf;
        continue;
      }
      x = scale * x + alibi_bias(slope, q_pos0 + t, k_pos0 + j, shift[t]);
      mx[t] = max_keep_nan(mx[t], x);
    }
}

/// Whether every element of a (rows, cols) block with row stride ld is finite. x * 0 is 0
/// for finite x and NaN for Inf/NaN; 16 independent lanes let the compiler vectorize it.
inline bool all_finite(const float* data, index_t ld, index_t rows, index_t cols) {
  float acc[16] = {};
  for (index_t r = 0; r < rows; ++r) {
    const float* row = data + r * ld;
    index_t c = 0;
    for (; c + 16 <= cols; c += 16)
      for (int t = 0; t < 16; ++t) acc[t] += row[c + t] * 0.0f;
    for (; c < cols; ++c) acc[0] += row[c] * 0.0f;
  }
  float total = 0.0f;
  for (float a : acc) total += a;
  return total == 0.0f;
}

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
