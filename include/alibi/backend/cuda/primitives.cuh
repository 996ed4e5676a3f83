// SPDX-License-Identifier: MIT
// Device primitives of the CUDA kernels: element conversions, asynchronous copies into
// shared memory, ldmatrix and the m16n8k16 tensor-core product (sm_80 and newer).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// The device pass of an older architecture would otherwise fail in ptxas, on cp.async and the
// bf16 mma.sync, with messages that do not say what to change.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error \
    "alibi's CUDA kernels need sm_80 or newer: set CUDA_ARCHITECTURES (CMAKE_CUDA_ARCHITECTURES, e.g. 80;90) of the target that includes alibi/cuda.cuh"
#endif

namespace alibi {
namespace cuda_detail {

/// Conversions between an element type and float, and packing two floats into the 32-bit
/// register a tensor-core fragment holds (first value in the low half).
template <class T>
struct elem;

template <>
struct elem<float> {
  static __device__ __forceinline__ float to_float(float x) { return x; }
  static __device__ __forceinline__ float from_float(float x) { return x; }
};

template <>
struct elem<__half> {
  static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

template <>
struct elem<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared without passing through registers (cp.async, L2 only).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_address(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/// Waits until at most N of this thread's committed copy groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Four 8x8 matrices of 16-bit elements from shared memory (see detail::ldsm_* for the
/// address each lane supplies).
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

/// c += a b for a 16x16 A (row-major), a 16x8 B (column-major) and a 16x8 fp32 C, with
/// half or bfloat16 inputs (PTX ISA: "Warp-level matrix multiply-accumulate instructions",
/// mma.sync.aligned.m16n8k16).
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4],
                                          std::uint32_t b0, std::uint32_t b1) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value,
                "tensor-core products take __half or __nv_bfloat16");
  if constexpr (std::is_same<T, __half>::value)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two products sharing the A fragment, with the two B fragments of one ldmatrix x4:
/// c0 += a (b[0], b[1]) and c1 += a (b[2], b[3]).
template <class T>
__device__ __forceinline__ void mma_16816_x2(float (&c0)[4], float (&c1)[4],
                                             const std::uint32_t (&a)[4],
                                             const std::uint32_t (&b)[4]) {
  mma_16816<T>(c0, a, b[0], b[1]);
  mma_16816<T>(c1, a, b[2], b[3]);
}

/// For every m tile mi: acc[mi][2 n] and acc[mi][2 n + 1] += a[mi] times the two 8-column
/// B fragments that one ldmatrix x4 (transposed: Trans) loads from b_smem. The step shared
/// by S = Q K^T (K rows, not transposed) and O += P V (V rows, transposed).
template <class T, bool Trans, int MI, int N>
__device__ __forceinline__ void mma_b_x4(float (&acc)[MI][N][4], int n,
                                         const std::uint32_t (&a)[MI][4], const T* b_smem) {
  std::uint32_t b[4];
  if constexpr (Trans)
    ldmatrix_x4_trans(b, b_smem);
  else
    ldmatrix_x4(b, b_smem);
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) mma_16816_x2<T>(acc[mi][2 * n], acc[mi][2 * n + 1], a[mi], b);
}

}  // namespace cuda_detail
}  // namespace alibi
