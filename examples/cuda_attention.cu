// SPDX-License-Identifier: MIT
// The quickstart on the GPU: causal ALiBi attention in bfloat16 over a (batch, seq, heads,
// dim) buffer with the CUDA backend, checked against the double-precision reference backend
// on the same (bfloat16-rounded) inputs. No Eigen in a CUDA translation unit: the fused CPU
// backend lives in C++ files. Without a GPU it reports that it was skipped (exit code 77).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <alibi/backend/reference/attention.hpp>

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    const cudaError_t e = (call);                                                     \
    if (e != cudaSuccess) {                                                           \
      std::printf("cuda_attention: %s failed: %s\n", #call, cudaGetErrorString(e)); \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_attention: SKIPPED, no CUDA device\n");
    return 77;
  }
  const alibi::index_t batch = 2, seq = 512, heads = 8, head_dim = 128;
  const std::size_t n = static_cast<std::size_t>(batch * seq * heads * head_dim);
  std::vector<float> q(n), k(n), v(n);
  std::mt19937 rng(0);
  std::normal_distribution<float> randn;
  std::vector<__nv_bfloat16> qb(n), kb(n), vb(n);
  for (std::size_t i = 0; i < n; ++i) {
    qb[i] = __float2bfloat16_rn(randn(rng));
    kb[i] = __float2bfloat16_rn(randn(rng));
    vb[i] = __float2bfloat16_rn(randn(rng));
    q[i] = __bfloat162float(qb[i]);  // the CPU sees exactly the GPU's inputs
    k[i] = __bfloat162float(kb[i]);
    v[i] = __bfloat162float(vb[i]);
  }
  __nv_bfloat16 *dq, *dk, *dv, *dout;
  for (auto* p : {&dq, &dk, &dv, &dout}) CHECK_CUDA(cudaMalloc(p, n * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMemcpy(dq, qb.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dk, kb.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv, vb.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));

  alibi::attention_params params;  // slopes of an 8-head model, scale 1/sqrt(128)
  params.mask.causal = true;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // Device views of (batch, seq, heads, dim) memory; the call queues work on `stream`.
  alibi::attention(alibi::backend::cuda{stream},
                   alibi::view_bshd<const __nv_bfloat16>(dq, batch, seq, heads, head_dim),
                   alibi::view_bshd<const __nv_bfloat16>(dk, batch, seq, heads, head_dim),
                   alibi::view_bshd<const __nv_bfloat16>(dv, batch, seq, heads, head_dim),
                   alibi::view_bshd(dout, batch, seq, heads, head_dim), params);
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<__nv_bfloat16> out(n);
  CHECK_CUDA(cudaMemcpy(out.data(), dout, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));

  std::vector<double> cpu(n);
  alibi::attention(alibi::backend::reference{},
                   alibi::view_bshd<const float>(q.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd<const float>(k.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd<const float>(v.data(), batch, seq, heads, head_dim),
                   alibi::view_bshd(cpu.data(), batch, seq, heads, head_dim), params);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::fmax(worst, std::fabs(static_cast<double>(__bfloat162float(out[i])) - cpu[i]));
    scale = std::fmax(scale, std::fabs(cpu[i]));
  }
  // bfloat16 output and probabilities: about 2^-8 relative of the output scale.
  const bool ok = worst <= 0x1p-7 * std::fmax(1.0, scale);
  std::printf("cuda_attention: bf16 causal ALiBi attention, batch %lld, seq %lld, %lld heads, "
              "head_dim %lld; max |cuda - cpu| = %.2e (output scale %.2f): %s\n",
              static_cast<long long>(batch), static_cast<long long>(seq),
              static_cast<long long>(heads), static_cast<long long>(head_dim), worst, scale,
              ok ? "ok" : "TOO LARGE");
  for (auto* p : {dq, dk, dv, dout}) cudaFree(p);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}
