// SPDX-License-Identifier: MIT
// The layer operations of the CUDA backend, for alibi::multi_head_attention /
// transformer_layer / kv_cache in device memory: projections and the feed-forward network
// through cuBLAS (fp32 accumulation), bias + activation and LayerNorm as small kernels,
// copies with cudaMemcpy2DAsync. Everything is queued on the backend's stream.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "alibi/backend/cuda/attention.cuh"
#include "alibi/backend/cuda/error.cuh"
#include "alibi/backend/cuda/primitives.cuh"
#include "alibi/layer_ops.hpp"

namespace alibi {
namespace cuda_detail {

/// The name of a cuBLAS status (cublasGetStatusName needs CUDA 11.4.2; this works with any).
inline const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return "unknown cuBLAS status";
  }
}

/// Turns a cuBLAS status into alibi::cuda_error naming the step and the cuBLAS status (its
/// name and number; cuBLAS statuses are not cudaError_t values, so code() is
/// cudaErrorUnknown).
inline void check_cublas(cublasStatus_t s, const char* step) {
  if (s != CUBLAS_STATUS_SUCCESS)
    detail::raise(cuda_error(std::string("alibi (cuda): ") + step +
                             " failed: " + cublas_status_name(s) + " (cuBLAS status " +
                             std::to_string(static_cast<int>(s)) + ")"));
}

/// A cuBLAS handle per (host thread, device): handles must not be shared between threads
/// that use them at the same time, and creating one per call costs milliseconds.
inline cublasHandle_t cublas_handle(cudaStream_t stream) {
  struct handles {
    std::map<int, cublasHandle_t> by_device;
    ~handles() {
      for (auto& h : by_device) cublasDestroy(h.second);
    }
  };
  thread_local handles cache;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  auto it = cache.by_device.find(device);
  if (it == cache.by_device.end()) {
    cublasHandle_t h = nullptr;
    check_cublas(cublasCreate(&h), "cublasCreate");
    it = cache.by_device.emplace(device, h).first;
  }
  check_cublas(cublasSetStream(it->second, stream), "cublasSetStream");
  return it->second;
}

template <class T>
constexpr cudaDataType_t cuda_type() {
  if constexpr (std::is_same<T, float>::value)
    return CUDA_R_32F;
  else if constexpr (std::is_same<T, __half>::value)
    return CUDA_R_16F;
  else
    return CUDA_R_16BF;
}

/// Owning device memory; resize() keeps nothing (the modules overwrite what they grow).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~device_buffer() {
    if (p_) cudaFree(p_);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  index_t size() const { return n_; }
  void resize(index_t n) {
    if (n <= n_) return;
    T* q = nullptr;
    check(cudaMalloc(&q, static_cast<std::size_t>(n) * sizeof(T)), "cudaMalloc (layer buffer)");
    if (p_) cudaFree(p_);  // synchronizes the device: no queued kernel still reads it
    p_ = q;
    n_ = n;
  }

 private:
  T* p_ = nullptr;
  index_t n_ = 0;
};

__device__ __forceinline__ float apply_activation(float x, int act) {
  // act: 0 none, 1 gelu (erf), 2 gelu_tanh, 3 silu; the formulas of the CPU backend.
  if (act == 1) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
  if (act == 2)
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x)));
  // x / (1 + exp(-x)): exp overflows to inf for x < -88 and the quotient is -0, not NaN.
  if (act == 3) return x / (1.0f + expf(-x));
  return x;
}

/// y (rows, cols; ld) = act(y + bias), bias (cols) may be null.
template <class T>
__global__ void bias_activation_kernel(T* y, index_t ld, index_t rows, index_t cols, const T* bias,
                                       int act) {
  const index_t total = rows * cols;
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t r = i / cols, c = i % cols;
    float v = elem<T>::to_float(y[r * ld + c]);
    if (bias) v += elem<T>::to_float(bias[c]);
    y[r * ld + c] = elem<T>::from_float(apply_activation(v, act));
  }
}

/// A block's sum of one float per thread (blockDim.x a multiple of 32, <= 1024).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += scratch[w];
  return total;
}

/// LayerNorm of one row per block, fp32 statistics, two passes (mean, then the variance of
/// x - mean: no cancellation). y may be x: each element is read before it is written.
template <class T>
__global__ void layer_norm_kernel(const T* x, index_t ldx, T* y, index_t ldy, index_t n,
                                  const T* gamma, const T* beta, float eps) {
  __shared__ float scratch[32];
  const T* in = x + static_cast<index_t>(blockIdx.x) * ldx;
  T* out = y + static_cast<index_t>(blockIdx.x) * ldy;
  float s = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) s += elem<T>::to_float(in[i]);
  const float mean = block_sum(s, scratch) / static_cast<float>(n);
  float q = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = elem<T>::to_float(in[i]) - mean;
    q += d * d;
  }
  const float inv = rsqrtf(block_sum(q, scratch) / static_cast<float>(n) + eps);
  for (index_t i = threadIdx.x; i < n; i += blockDim.x)
    out[i] =
        elem<T>::from_float((elem<T>::to_float(in[i]) - mean) * inv * elem<T>::to_float(gamma[i]) +
                            (beta ? elem<T>::to_float(beta[i]) : 0.0f));
}

/// RMSNorm of one row per block: x / sqrt(mean(x^2) + eps) gamma, fp32 statistics. y may be
/// x: the sum is complete (block_sum) before any element is written.
template <class T>
__global__ void rms_norm_kernel(const T* x, index_t ldx, T* y, index_t ldy, index_t n,
                                const T* gamma, float eps) {
  __shared__ float scratch[32];
  const T* in = x + static_cast<index_t>(blockIdx.x) * ldx;
  T* out = y + static_cast<index_t>(blockIdx.x) * ldy;
  float q = 0;
  for (index_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = elem<T>::to_float(in[i]);
    q += v * v;
  }
  const float inv = rsqrtf(block_sum(q, scratch) / static_cast<float>(n) + eps);
  for (index_t i = threadIdx.x; i < n; i += blockDim.x)
    out[i] = elem<T>::from_float(elem<T>::to_float(in[i]) * inv * elem<T>::to_float(gamma[i]));
}

/// a (rows, cols; lda) *= b (rows, cols; ldb), element-wise in fp32.
template <class T>
__global__ void multiply_kernel(T* a, index_t lda, const T* b, index_t ldb, index_t rows,
                                index_t cols) {
  const index_t total = rows * cols;
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t r = i / cols, c = i % cols;
    a[r * lda + c] =
        elem<T>::from_float(elem<T>::to_float(a[r * lda + c]) * elem<T>::to_float(b[r * ldb + c]));
  }
}

}  // namespace cuda_detail

namespace detail {

template <>
struct layer_ops<backend::cuda> {
  template <class T>
  using buffer = cuda_detail::device_buffer<T>;

  template <class T>
  static void upload(const backend::cuda& be, const std::vector<T>& host, buffer<T>& dst) {
    dst.resize(static_cast<index_t>(host.size()));
    if (host.empty()) return;
    cuda_detail::check(cudaMemcpyAsync(dst.data(), host.data(), host.size() * sizeof(T),
                                       cudaMemcpyHostToDevice, be.stream),
                       "cudaMemcpyAsync (parameter upload)");
    cuda_detail::check(cudaStreamSynchronize(be.stream), "cudaStreamSynchronize (upload)");
  }
  template <class T>
  static std::vector<T> download(const backend::cuda& be, const buffer<T>& src) {
    std::vector<T> host(static_cast<std::size_t>(src.size()));
    if (host.empty()) return host;
    cuda_detail::check(cudaMemcpyAsync(host.data(), src.data(), host.size() * sizeof(T),
                                       cudaMemcpyDeviceToHost, be.stream),
                       "cudaMemcpyAsync (parameter download)");
    cuda_detail::check(cudaStreamSynchronize(be.stream), "cudaStreamSynchronize (download)");
    return host;
  }
  template <class T>
  static void resize(buffer<T>& b, index_t n) {
    b.resize(n);
  }

  /// y (rows, out) = act(x w^T + bias) or y += x w^T + bias. Row-major y (rows, out) is
  /// column-major (out, rows): y^T = w x^T, with w (out, in) row-major read as the
  /// column-major (in, out) matrix it is, transposed.
  template <class T>
  static void linear(const backend::cuda& be, const T* x, index_t ldx, index_t rows, index_t in,
                     const T* w, const T* bias, index_t out, T* y, index_t ldy, bool accumulate,
                     const activation* act) {
    if (rows == 0 || out == 0) return;
    if (rows > INT32_MAX || in > INT32_MAX || out > INT32_MAX || ldx > INT32_MAX || ldy > INT32_MAX)
      detail::raise(
          argument_error("alibi (cuda): a projection's rows, features or row stride exceed the "
                         "32-bit sizes cuBLAS takes"));
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    constexpr cudaDataType_t type = cuda_detail::cuda_type<T>();
    cuda_detail::check_cublas(
        cublasGemmEx(cuda_detail::cublas_handle(be.stream), CUBLAS_OP_T, CUBLAS_OP_N,
                     static_cast<int>(out), static_cast<int>(rows), static_cast<int>(in), &alpha, w,
                     type, static_cast<int>(in > 0 ? in : 1), x, type,
                     static_cast<int>(ldx > 0 ? ldx : 1), &beta, y, type, static_cast<int>(ldy),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (projection)");
    const int a = act == nullptr                  ? 0
                  : *act == activation::gelu      ? 1
                  : *act == activation::gelu_tanh ? 2
                                                  : 3;
    if (bias == nullptr && a == 0) return;
    const index_t total = rows * out;
    const int blocks = static_cast<int>(std::min<index_t>((total + 255) / 256, 65535));
    cuda_detail::bias_activation_kernel<T>
        <<<blocks, 256, 0, be.stream>>>(y, ldy, rows, out, bias, a);
    cuda_detail::check(cudaGetLastError(), "bias/activation kernel launch");
  }

  template <class T>
  static void layer_norm(const backend::cuda& be, const T* x, index_t ldx, T* y, index_t ldy,
                         index_t rows, index_t n, const T* gamma, const T* beta, float eps) {
    if (rows == 0 || n == 0) return;
    if (rows > INT32_MAX)
      detail::raise(argument_error("alibi (cuda): layer_norm rows exceed 2^31 - 1"));
    cuda_detail::layer_norm_kernel<T>
        <<<static_cast<unsigned>(rows), 256, 0, be.stream>>>(x, ldx, y, ldy, n, gamma, beta, eps);
    cuda_detail::check(cudaGetLastError(), "layer_norm kernel launch");
  }

  template <class T>
  static void rms_norm(const backend::cuda& be, const T* x, index_t ldx, T* y, index_t ldy,
                       index_t rows, index_t n, const T* gamma, float eps) {
    if (rows == 0 || n == 0) return;
    if (rows > INT32_MAX)
      detail::raise(argument_error("alibi (cuda): rms_norm rows exceed 2^31 - 1"));
    cuda_detail::rms_norm_kernel<T>
        <<<static_cast<unsigned>(rows), 256, 0, be.stream>>>(x, ldx, y, ldy, n, gamma, eps);
    cuda_detail::check(cudaGetLastError(), "rms_norm kernel launch");
  }

  template <class T>
  static void multiply(const backend::cuda& be, T* a, index_t lda, const T* b, index_t ldb,
                       index_t rows, index_t cols) {
    if (rows == 0 || cols == 0) return;
    const index_t total = rows * cols;
    const int blocks = static_cast<int>(std::min<index_t>((total + 255) / 256, 65535));
    cuda_detail::multiply_kernel<T><<<blocks, 256, 0, be.stream>>>(a, lda, b, ldb, rows, cols);
    cuda_detail::check(cudaGetLastError(), "multiply kernel launch");
  }

  template <class T>
  static void copy_rows(const backend::cuda& be, const T* src, index_t lds, T* dst, index_t ldd,
                        index_t rows, index_t cols) {
    if (rows == 0 || cols == 0 || (src == dst && lds == ldd)) return;
    cuda_detail::check(
        cudaMemcpy2DAsync(dst, ldd * sizeof(T), src, lds * sizeof(T), cols * sizeof(T), rows,
                          cudaMemcpyDeviceToDevice, be.stream),
        "cudaMemcpy2DAsync (rows)");
  }
  /// Rows between host memory and device memory, either way (or device to device): the
  /// pointers tell the direction (cudaMemcpyDefault, unified addressing). Queued on the
  /// stream; fence(be) before the host reads rows it wrote or reuses rows it read. Host
  /// memory may be pageable. Row strides below the row (broadcast rows) copy row by row.
  template <class T>
  static void stage_rows(const backend::cuda& be, const T* src, index_t lds, T* dst, index_t ldd,
                         index_t rows, index_t cols) {
    if (rows <= 0 || cols <= 0) return;
    const std::size_t width = static_cast<std::size_t>(cols) * sizeof(T);
    if (rows == 1 || lds < cols || ldd < cols) {
      for (index_t r = 0; r < rows; ++r)
        cuda_detail::check(
            cudaMemcpyAsync(dst + r * ldd, src + r * lds, width, cudaMemcpyDefault, be.stream),
            "cudaMemcpyAsync (staging)");
      return;
    }
    cuda_detail::check(
        cudaMemcpy2DAsync(dst, static_cast<std::size_t>(ldd) * sizeof(T), src,
                          static_cast<std::size_t>(lds) * sizeof(T), width,
                          static_cast<std::size_t>(rows), cudaMemcpyDefault, be.stream),
        "cudaMemcpy2DAsync (staging)");
  }
  template <class T>
  static void zero_rows(const backend::cuda& be, T* dst, index_t ld, index_t rows, index_t cols) {
    if (rows == 0 || cols == 0) return;
    // All-zero bits are +0 in float, half and bfloat16.
    cuda_detail::check(cudaMemset2DAsync(dst, ld * sizeof(T), 0, cols * sizeof(T), rows, be.stream),
                       "cudaMemset2DAsync (padded rows)");
  }
  static tensor_view<const index_t, 1> per_batch(const backend::cuda& be,
                                                 const std::vector<index_t>& host,
                                                 buffer<index_t>& scratch) {
    // Pageable source: per the CUDA runtime's API synchronization rules, cudaMemcpyAsync
    // from pageable host memory returns once the source has been staged, so `host` may go.
    scratch.resize(static_cast<index_t>(host.size()));
    if (!host.empty())
      cuda_detail::check(cudaMemcpyAsync(scratch.data(), host.data(), host.size() * sizeof(index_t),
                                         cudaMemcpyHostToDevice, be.stream),
                         "cudaMemcpyAsync (lengths)");
    return make_view<const index_t>(scratch.data(), static_cast<index_t>(host.size()));
  }
  static tensor_view<const bool, 2> key_mask(const backend::cuda& be,
                                             tensor_view<const bool, 2> host,
                                             buffer<bool>& scratch) {
    const index_t B = host.extents[0], L = host.extents[1];
    std::vector<char> dense(static_cast<std::size_t>(B * L));
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < L; ++j)
        dense[static_cast<std::size_t>(b * L + j)] = host(b, j) ? 1 : 0;
    scratch.resize(B * L);
    if (!dense.empty())
      cuda_detail::check(cudaMemcpyAsync(scratch.data(), dense.data(), dense.size(),
                                         cudaMemcpyHostToDevice, be.stream),
                         "cudaMemcpyAsync (key mask)");
    return make_view<const bool>(scratch.data(), B, L);
  }
  static void fence(const backend::cuda& be) {
    cuda_detail::check(cudaStreamSynchronize(be.stream), "cudaStreamSynchronize (fence)");
  }
};

}  // namespace detail
}  // namespace alibi
