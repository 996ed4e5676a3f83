// SPDX-License-Identifier: MIT
// alibi::merge_partials on the CUDA backend: one thread per row, the row's
// weights from the shared state (detail::row_merge), queued on the backend's stream.
#pragma once

#include <cuda_runtime.h>

#include "alibi/backend/cuda/error.cuh"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/merge.hpp"

namespace alibi {
namespace cuda_detail {

/// One thread per row: the row's logsumexps are read before its lse is written, so `lse`
/// may be the same view as lse_a or lse_b.
template <class T>
__global__ void __launch_bounds__(256) partial_merge_kernel(const detail::partial_merge_args<T> a) {
  const index_t H = a.out.extents[1], L = a.out.extents[2], D = a.out.extents[3];
  const index_t rows = a.out.extents[0] * H * L;
  for (index_t row = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t i = row % L, h = (row / L) % H, b = row / (L * H);
    const detail::row_merge r = detail::row_merge::make(a.lse_a(b, h, i), a.lse_b(b, h, i));
    for (index_t d = 0; d < D; ++d)
      a.out(b, h, i, d) = elem<T>::from_float(
          r.value(elem<T>::to_float(a.out_a(b, h, i, d)), elem<T>::to_float(a.out_b(b, h, i, d))));
    if (a.lse.data) a.lse(b, h, i) = r.lse;
  }
}

/// Queues the merge on `stream`.
template <class T>
void launch_partial_merge(const detail::partial_merge_args<T>& a, cudaStream_t stream) {
  const index_t rows = a.out.extents[0] * a.out.extents[1] * a.out.extents[2];
  if (rows == 0 || a.out.extents[3] == 0) return;
  const index_t blocks = (rows + 255) / 256;
  partial_merge_kernel<T>
      <<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(a);
  check(cudaGetLastError(), "merge_partials kernel launch");
}

}  // namespace cuda_detail
}  // namespace alibi
