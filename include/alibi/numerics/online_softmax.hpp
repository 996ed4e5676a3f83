// SPDX-License-Identifier: MIT
// The online (streaming) softmax state, shared by every kernel and every merge: the CPU
// kernel, the CUDA kernels (tiles, decoding warps, careful rows), the split-KV merges and the
// public partial-result merge (alibi/merge.hpp).
//
// One convention everywhere: scores are kept in base-2 units (s * log2(e)), so that every
// exponential is a power of two (2^x: the GPU's ex2 instruction, and on the CPU a polynomial
// with a cheap range reduction). The natural-log logsumexp of the contract is formed only
// when a row is finished.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "alibi/core/config.hpp"

namespace alibi {
namespace detail {

inline constexpr float log2e_f = 1.44269504088896341f;
inline constexpr float ln2_f = 0.693147180559945309f;

/// Below this base-2 argument exponentials are flushed to exactly 0 (2^-86 = 1.3e-26).
/// Why: on x86 every denormal operand or result costs a microcode assist. Below -126 2^x is
/// itself denormal, and weights just above that still make denormals downstream, in the
/// products p * v of the P V GEMM and in accumulators rescaled by such a factor, which slowed
/// the steepest ALiBi heads, whose far scores sit at -86..-126 relative to the row maximum
/// (docs/journal/2026-12-design-measurements.md,
/// "numerics/online_softmax.hpp: exp2_flush_threshold"). Flushing below -86 keeps p * v
/// normal for any |v| > 1e-11. The dropped weights are < 1.3e-26 each relative to the row
/// maximum's weight of 1: even 2^40 of them change the row sum by < 2e-14, far below fp32
/// resolution. No FTZ/DAZ change to the caller's floating-point environment is needed.
inline constexpr float exp2_flush_threshold = -86.0f;

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

/// max(a, b) that keeps a NaN of either argument (fmaxf would drop it): a NaN score must
/// reach its row's output (contract: NaN in used inputs propagates).
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float max_keep_nan(float a, float b) {
  return (b > a || b != b) ? b : a;
}

/// 2^x for the softmax's arguments x <= 0. On the device the hardware approximation
/// (ex2.approx.ftz, about 2 ulp, denormal results flushed); on the host the library function
/// with the flush below exp2_flush_threshold. 2^-inf = 0 and NaN propagates on both.
/// (The CPU kernel's inner loops use the vectorized polynomial of the eigen backend, with
/// the same threshold.)
ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float exp2_flush(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return x < exp2_flush_threshold ? 0.0f : std::exp2(x);
#endif
}

/// What one step of the online softmax tells a kernel: exponentiate the new scores as
/// 2^(s - ref), and multiply everything accumulated before by `factor`.
/// Why `ref`: while every score seen is masked the maximum is -inf, and 2^(-inf - -inf)
/// would be NaN; against 0 the masked scores give exactly 0. `factor` is exactly 0 when
/// nothing was accumulated (m_old = -inf) and exactly 1 when the maximum did not move.
struct softmax_step {
  float ref = 0.0f, factor = 0.0f;
};

/// The running state of one softmax row, in base-2 units: the maximum m of the scores seen
/// so far and the sum l of 2^(s - m). m = -inf (l = 0) while every score seen was masked; m
/// (or l) NaN once a NaN score was met.
struct softmax_state {
  float m = neg_inf_f();
  float l = 0.0f;

  /// Moves the state to a new maximum after a tile whose largest score is tile_max. The
  /// caller exponentiates the tile against step.ref, multiplies its accumulated output by
  /// step.factor, and adds the tile's sum with add().
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE softmax_step rescale(float tile_max) {
    const float m_new = max_keep_nan(m, tile_max);
    softmax_step s;
    s.ref = m_new == neg_inf_f() ? 0.0f : m_new;
    // Nearest tiles come first, so the maximum rarely moves after the first tiles: then the
    // factor is exactly 1 without an exponential (on the CPU a library call per row and
    // tile).
    s.factor = m_new == m && m != neg_inf_f() ? 1.0f : exp2_flush(m - s.ref);
    m = m_new;
    return s;
  }
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE void add(const softmax_step& s, float tile_sum) {
    l = l * s.factor + tile_sum;
  }

  /// 1 / l for normalizing the row's output: 0 for a row with no keys (output 0, never
  /// 0 / 0), NaN when the row met a NaN.
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float inverse_sum() const {
    return l > 0.0f ? 1.0f / l : (l != l || m != m ? nan_f() : 0.0f);
  }
  /// The base-2 logsumexp m + log2(l): -inf for a row with no keys, NaN after a NaN.
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float lse2() const {
    if (l != l || m != m) return nan_f();
    return l > 0.0f ? m + log2f(l) : neg_inf_f();
  }
  /// The contract's natural-log logsumexp. `bias_shift` is added back: kernels compute
  /// scores with the row's distance shift removed (+slope * shift, see distance_shift), so
  /// they pass -slope * shift here.
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE float lse(float bias_shift = 0.0f) const {
    const float x = lse2();
    return x == neg_inf_f() || x != x ? x : x * ln2_f + bias_shift;
  }

  /// The state of a finished, normalized partial result (its output already divided by
  /// its sum) whose base-2 logsumexp is `lse2`: m = lse2, l = 1. -inf (no keys) gives the
  /// empty state, NaN the NaN state. Split-KV partial results are stored this way: base 2
  /// keeps their merge free of a round trip through the natural log.
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE static softmax_state from_lse2(float lse2) {
    softmax_state s;
    if (lse2 != lse2) {
      s.m = s.l = nan_f();
    } else if (lse2 != neg_inf_f()) {
      s.m = lse2;
      s.l = 1.0f;
    }
    return s;
  }
  /// The same from the contract's natural-log logsumexp (what attention() writes).
  ALIBI_HOST_DEVICE ALIBI_FORCEINLINE static softmax_state from_lse(float lse) {
    return from_lse2(lse != lse || lse == neg_inf_f() ? lse : lse * log2e_f);
  }
};

/// The merge of two partial states over disjoint key sets: the merged state and the
/// weights by which each side's (unnormalized, relative to its own m) output is multiplied
/// before the two are added. A side with no keys gets weight 0; NaN on either side makes
/// the merged state NaN.
struct softmax_merge {
  softmax_state state;
  float wa = 0.0f, wb = 0.0f;
};

ALIBI_HOST_DEVICE ALIBI_FORCEINLINE softmax_merge merge_states(const softmax_state& a,
                                                               const softmax_state& b) {
  softmax_merge r;
  r.state.m = max_keep_nan(a.m, b.m);
  const float ref = r.state.m == neg_inf_f() ? 0.0f : r.state.m;
  r.wa = exp2_flush(a.m - ref);
  r.wb = exp2_flush(b.m - ref);
  r.state.l = a.l * r.wa + b.l * r.wb;
  return r;
}

}  // namespace detail
}  // namespace alibi
