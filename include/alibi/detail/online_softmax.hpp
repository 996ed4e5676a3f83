// SPDX-License-Identifier: MIT
// The scalar pieces of the online (streaming) softmax, shared by the CPU and CUDA kernels:
// an exp that never produces denormals, and the merge of two partial softmax states.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "alibi/config.hpp"

namespace alibi {
namespace detail {

ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float bits_to_float(std::int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#else
  return __builtin_bit_cast(float, i);
#endif
}
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE std::int32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  return __builtin_bit_cast(std::int32_t, f);
#endif
}

/// -inf and a quiet NaN, usable in device code without relaxed-constexpr flags.
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float neg_inf_f() {
  return bits_to_float(static_cast<std::int32_t>(0xff800000u));
}
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float nan_f() { return bits_to_float(0x7fc00000); }

/// Below this argument exp_flush returns exactly 0 (exp(-60) = 8.8e-27).
constexpr float exp_flush_threshold = -60.0f;

/// exp(x) for x <= 0 (softmax arguments s - max), written so that it vectorizes:
/// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2; exp(r) by its degree-6 Taylor
/// polynomial (truncation error r^7/7! < 1.3e-7 relative, about one ulp); 2^n built in the
/// exponent bits.
/// Why the flush: on x86 every denormal operand or result costs a microcode assist. Below
/// -87 exp itself is denormal; and weights just above that still make denormals downstream,
/// in the products p * v of the P V GEMM and in accumulators rescaled by such a factor
/// (measured: 2x on the steepest ALiBi heads, whose far scores sit at -60..-87 relative to
/// the row maximum). Flushing below -60 keeps p * v normal for any |v| > 1e-11. The dropped
/// weights are < 8.8e-27 each relative to the row maximum's weight of 1: even 2^40 of them
/// change the row sum by < 1e-14, far below fp32 resolution. No FTZ/DAZ change to the
/// caller's floating-point environment is needed.
/// -inf (masked scores) gives exactly 0; NaN propagates.
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float exp_flush(float x) {
  // 1.5 * 2^23: adding it rounds a float of magnitude < 2^22 to an integer (ties to even),
  // and leaves that integer in the low mantissa bits.
  constexpr float round_magic = 12582912.0f;
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693145751953125f;  // ln 2 split so that n * ln2_hi is exact
  constexpr float ln2_lo = 1.42860682030941723e-6f;
  const float xc = x < exp_flush_threshold ? exp_flush_threshold : x;  // keeps n in range
  const float z = xc * log2e + round_magic;
  const float n = z - round_magic;
  float r = xc - n * ln2_hi;
  r = r - n * ln2_lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // The integer n sits in z's low mantissa bits; add the exponent bias and shift it into place.
  // (In unsigned arithmetic: for NaN arguments the bits are garbage, and signed overflow
  // on them would be undefined behaviour; the result is NaN either way.)
  const std::uint32_t n_bits = static_cast<std::uint32_t>(float_to_bits(z)) -
                               static_cast<std::uint32_t>(float_to_bits(round_magic)) + 127u;
  const std::int32_t e = static_cast<std::int32_t>(n_bits << 23);
  const float y = p * bits_to_float(e);
  // x < threshold covers -inf (masked keys give exactly 0); a NaN x compares false, passed
  // through xc unchanged and made y NaN, so NaN propagates.
  return x < exp_flush_threshold ? 0.0f : y;
}

/// The running state of one softmax row: max m of the scores seen so far and the sum l of
/// exp(s - m). m = -inf (l = 0) while every score seen was masked.
struct softmax_state {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

/// The factor by which a partial result accumulated relative to m_old must be multiplied
/// to become relative to m_new >= m_old. 0 when nothing was accumulated yet (m_old = -inf),
/// which also avoids exp(-inf - (-inf)) = NaN.
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float rescale_factor(float m_old, float m_new) {
  return m_old == neg_inf_f() ? 0.0f : exp_flush(m_old - m_new);
}

/// logsumexp of a finished row: -inf when every key was masked.
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float finish_lse(softmax_state s) {
  return s.l > 0.0f ? s.m + logf(s.l) : (s.l != s.l ? s.l : neg_inf_f());
}

}  // namespace detail
}  // namespace alibi
