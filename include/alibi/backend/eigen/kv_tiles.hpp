// SPDX-License-Identifier: MIT
// K and V as the fused CPU kernel reads them: fp32 in place, fp16 / bf16 converted tile by
// tile into per-thread fp32 buffers for the GEMMs (the small-row products of decoding widen
// them in registers instead, small_rows.hpp). Scores, softmax and accumulation stay fp32
// whatever the storage; half-precision storage halves the bytes a memory-bound decode step
// streams.
#pragma once

#include <cstring>
#include <type_traits>

#include <Eigen/Core>

#include "alibi/backend/eigen/simd.hpp"
#include "alibi/backend/eigen/workspace.hpp"
#include "alibi/config.hpp"
#include "alibi/tensor_view.hpp"

namespace alibi {
namespace detail {
namespace cpu {

inline namespace ALIBI_CPU_ISA {

/// dst[0, n) = src[0, n) as floats, a packet at a time (load_floats: Eigen's F16C / shift
/// conversion where it vectorizes the type), then the scalar tail. Both conversions are
/// exact (every half and bfloat16 value is a float); the vector and scalar paths give the
/// same floats for every bit pattern except signalling NaNs, which F16C returns quieted (a
/// NaN either way).
template <class T>
void to_float(const T* src, float* dst, index_t n) {
  index_t i = 0;
  for (; i + lanes <= n; i += lanes) Eigen::internal::pstoreu(dst + i, load_floats(src + i));
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void to_float(const float* src, float* dst, index_t n) {
  std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

using kv_row_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using kv_rows_map = Eigen::Map<const kv_row_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// The K and V rows of one key tile, as fp32 matrices: k (bk, D), v (bk, Dv).
struct kv_tile {
  kv_rows_map k, v;
};

/// Per-thread fp32 copies of one K tile and one V tile (half-precision storage only).
struct kv_tile_buffers {
  aligned_buffer<float> k, v;
  static kv_tile_buffers& local() {
    thread_local kv_tile_buffers b;
    return b;
  }
};

/// K (B, Hkv, Lk, D) and V (B, Hkv, Lk, Dv) of a call in storage type T.
template <class T>
struct kv_source {
  tensor_view<const T, 4> k, v;

  /// Keys [j0, j0 + bk) of (b, hk): views of the memory for float, otherwise converted into
  /// the calling thread's buffers (valid until its next tile() call).
  kv_tile tile(index_t b, index_t hk, index_t j0, index_t bk) const {
    const index_t d = k.extents[3], dv = v.extents[3];
    if constexpr (std::is_same<T, float>::value) {
      return {kv_rows_map(k.ptr(b, hk, j0), bk, d, Eigen::OuterStride<>(k.strides[2])),
              kv_rows_map(v.ptr(b, hk, j0), bk, dv, Eigen::OuterStride<>(v.strides[2]))};
    } else {
      kv_tile_buffers& buf = kv_tile_buffers::local();
      // Padded leading dimensions keep every row 64-byte aligned, like the workspace.
      const index_t ldk = padded_stride(std::max<index_t>(d, 1));
      const index_t ldv = padded_stride(std::max<index_t>(dv, 1));
      buf.k.reserve(static_cast<std::size_t>(kernel_config::block_k * ldk));
      buf.v.reserve(static_cast<std::size_t>(kernel_config::block_k * ldv));
      to_floats(true, b, hk, j0, bk, buf.k.data(), ldk);
      to_floats(false, b, hk, j0, bk, buf.v.data(), ldv);
      return {kv_rows_map(buf.k.data(), bk, d, Eigen::OuterStride<>(ldk)),
              kv_rows_map(buf.v.data(), bk, dv, Eigen::OuterStride<>(ldv))};
    }
  }

  /// The K (keys) or V rows [j0, j0 + n) of (b, hk) as floats into dst (leading dimension ld).
  void to_floats(bool keys, index_t b, index_t hk, index_t j0, index_t n, float* dst,
                 index_t ld) const {
    const tensor_view<const T, 4>& t = keys ? k : v;
    for (index_t j = 0; j < n; ++j) to_float(t.ptr(b, hk, j0 + j), dst + j * ld, t.extents[3]);
  }

  /// Requests the K (or V) row of key j of (b, hk) from memory, ahead of its use.
  void prefetch(bool keys, index_t b, index_t hk, index_t j) const {
    const tensor_view<const T, 4>& t = keys ? k : v;
    const char* row = reinterpret_cast<const char*>(t.ptr(b, hk, j));
    const auto bytes = static_cast<index_t>(t.extents[3] * sizeof(T));
    for (index_t c = 0; c < bytes; c += 64) {
      __builtin_prefetch(row + c, 0, 2);  // into L2 (prefetcht1 on x86)
      // GCC deletes a loop whose body is only prefetches (to it they have no effect, so the
      // loop is dead code: no request was ever issued before this statement was added); an
      // empty volatile asm statement counts as one, and keeps every line's request.
      asm volatile("");
    }
  }

  /// |k_j|^2 of key j of (b, hk), accumulated in float as for fp32 storage.
  float key_squared_norm(index_t b, index_t hk, index_t j) const {
    const index_t d = k.extents[3];
    if constexpr (std::is_same<T, float>::value) {
      return Eigen::Map<const Eigen::RowVectorXf>(k.ptr(b, hk, j), d).squaredNorm();
    } else {
      thread_local aligned_buffer<float> row;
      row.reserve(static_cast<std::size_t>(std::max<index_t>(d, 1)));
      to_float(k.ptr(b, hk, j), row.data(), d);
      return Eigen::Map<const Eigen::RowVectorXf>(row.data(), d).squaredNorm();
    }
  }
};

}  // namespace ALIBI_CPU_ISA
}  // namespace cpu
}  // namespace detail
}  // namespace alibi
