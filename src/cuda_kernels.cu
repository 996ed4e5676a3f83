// SPDX-License-Identifier: MIT
// The CUDA backend's attention kernels compiled once, for alibi's own CUDA tests and
// benchmarks (the alibi_cuda_kernels target, not installed): the files linked with it see
// the kernels declared (ALIBI_CUDA_PRECOMPILED_KERNELS, backend/cuda/attention.cuh) and call
// these instances.
#include "alibi/backend/cuda/attention.cuh"

#if defined(ALIBI_CUDA_PRECOMPILED_KERNELS)
#error "src/cuda_kernels.cu defines the kernels: compile it without ALIBI_CUDA_PRECOMPILED_KERNELS"
#endif

namespace alibi {
namespace cuda_detail {

#define ALIBI_CUDA_DEFINE_LAUNCH(T, D) template ALIBI_CUDA_LAUNCH_SIGNATURE(T, D);
ALIBI_CUDA_KERNEL_INSTANCES(ALIBI_CUDA_DEFINE_LAUNCH)
#undef ALIBI_CUDA_DEFINE_LAUNCH

}  // namespace cuda_detail
}  // namespace alibi
