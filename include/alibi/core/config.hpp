// SPDX-License-Identifier: MIT
// alibi: annotation macros and the overridable assert/throw hooks. Every other header
// includes this one first; nothing here pulls a third-party header.
#pragma once

#include <cstdlib>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ALIBI_HOST_DEVICE __host__ __device__
#define ALIBI_DEVICE __device__
#else
#define ALIBI_HOST_DEVICE
#define ALIBI_DEVICE
#endif

#if defined(_MSC_VER)
#define ALIBI_FORCEINLINE __forceinline
#else
#define ALIBI_FORCEINLINE inline __attribute__((always_inline))
#endif

// ALIBI_THROW(e): how the library reports a bad argument. Users who build without
// exceptions define it before including any alibi header (for example to log and abort);
// the non-throwing `can_implement` front end never uses it. The library invokes it only
// through alibi::detail::raise, which is [[noreturn]]: a user ALIBI_THROW that returns
// ends the program with std::abort() (the code after a failed check is never run).
#ifndef ALIBI_THROW
#define ALIBI_THROW(e) throw(e)
#endif

// ALIBI_ASSERT(cond): internal invariants only (never argument checking, which always
// produces an alibi::error). Off unless ALIBI_ENABLE_ASSERTS is defined.
#ifndef ALIBI_ASSERT
#if defined(ALIBI_ENABLE_ASSERTS)
#include <cassert>
#define ALIBI_ASSERT(cond) assert(cond)
#else
#define ALIBI_ASSERT(cond) static_cast<void>(0)
#endif
#endif

// ALIBI_CPU_ISA: the name of the inline namespace that holds alibi's CPU code compiled for
// this translation unit's instruction set and OpenMP setting. Translation units built with
// different -march flags get differently named kernels, so the linker never merges an
// AVX-512 kernel with a baseline one (docs/architecture.md). With -fopenmp
// the CPU code differs too (detail::parallel_for keeps Eigen's products single-threaded in
// alibi's workers), so the name gains "_omp". Only the name depends on the flags.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define ALIBI_CPU_ISA_BASE isa_avx512dq
#elif defined(__AVX512F__)
#define ALIBI_CPU_ISA_BASE isa_avx512f
#elif defined(__AVX2__) && defined(__FMA__)
#define ALIBI_CPU_ISA_BASE isa_avx2_fma
#elif defined(__AVX2__)
#define ALIBI_CPU_ISA_BASE isa_avx2
#elif defined(__AVX__)
#define ALIBI_CPU_ISA_BASE isa_avx
#elif defined(__SSE4_2__)
#define ALIBI_CPU_ISA_BASE isa_sse4_2
#elif defined(__SSE2__)
#define ALIBI_CPU_ISA_BASE isa_sse2
#elif defined(__ARM_NEON)
#define ALIBI_CPU_ISA_BASE isa_neon
#else
#define ALIBI_CPU_ISA_BASE isa_generic
#endif

#define ALIBI_CAT_IMPL(a, b) a##b
#define ALIBI_CAT(a, b) ALIBI_CAT_IMPL(a, b)
#if defined(_OPENMP)
#define ALIBI_CPU_ISA ALIBI_CAT(ALIBI_CPU_ISA_BASE, _omp)
#else
#define ALIBI_CPU_ISA ALIBI_CPU_ISA_BASE
#endif

#ifdef __cplusplus
namespace alibi {
namespace detail {
inline namespace ALIBI_CPU_ISA {
/// A type named after this translation unit's instruction set (see ALIBI_CPU_ISA).
struct isa_tag {};
}  // namespace ALIBI_CPU_ISA
}  // namespace detail
}  // namespace alibi
#endif

namespace alibi {
namespace detail {

/// Reports an error (alibi::error, alibi::cuda_error) through ALIBI_THROW. Every throw in
/// the library goes through here, so that a user ALIBI_THROW that returns cannot make a
/// function fall off its end or carry on past a failed check.
template <class E>
[[noreturn]] inline void raise(const E& e) {
  ALIBI_THROW(e);
  std::abort();
}

}  // namespace detail
}  // namespace alibi

#define ALIBI_VERSION_MAJOR 0
#define ALIBI_VERSION_MINOR 1
#define ALIBI_VERSION_PATCH 0
