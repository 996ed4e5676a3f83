// SPDX-License-Identifier: MIT
// The CUDA runner of the MPI sequence-parallel tests (mpi_ring_cuda.cpp): every host view of a
// call is mirrored into device memory (cudaMalloc'd, its strides, gaps and guards too), the
// call runs with backend::cuda on the device copies (alibi::mpi stages them through host
// memory), and out and the logsumexp are copied back. Per-batch lengths, the key mask and caller
// slopes are passed in device memory, as the CUDA backend's contract asks.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <type_traits>

#include <alibi/cuda.cuh>
#include <alibi/mpi.hpp>

#include "mpi_runner.hpp"

namespace {

using alibi::index_t;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw alibi::argument_error(std::string("mpi_cuda_runner: ") + what + ": " + cudaGetErrorString(e));
}

/// A device copy of the elements a host view spans (from its first element to its last).
template <class T, int R>
class mirrored {
  using U = std::remove_const_t<T>;

 public:
  explicit mirrored(alibi::tensor_view<T, R> host) : host_(host), dev_(host) {
    if (host.data == nullptr) return;
    count_ = 1;
    for (int i = 0; i < R; ++i) {
      if (host.extents[i] <= 0) {
        count_ = 0;
        return;
      }
      count_ += (host.extents[i] - 1) * host.strides[i];
    }
    check(cudaMalloc(&data_, static_cast<std::size_t>(count_) * sizeof(U)), "cudaMalloc");
    check(cudaMemcpy(data_, host.data, static_cast<std::size_t>(count_) * sizeof(U),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy (to the device)");
    dev_.data = data_;
  }
  mirrored(const mirrored&) = delete;
  mirrored& operator=(const mirrored&) = delete;
  ~mirrored() {
    if (data_) cudaFree(data_);
  }
  alibi::tensor_view<T, R> view() const { return dev_; }
  /// The device copy back into the host view's elements (a writable view).
  void back() const {
    if (count_ == 0) return;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaMemcpy(const_cast<U*>(host_.data), data_,
                     static_cast<std::size_t>(count_) * sizeof(U), cudaMemcpyDeviceToHost),
          "cudaMemcpy (to the host)");
  }

 private:
  alibi::tensor_view<T, R> host_, dev_;
  U* data_ = nullptr;
  index_t count_ = 0;
};

/// params with its per-batch lengths, key mask, caller slopes and logsumexp in device memory.
struct device_params {
  mirrored<const index_t, 1> q_lengths, k_lengths;
  mirrored<const bool, 2> key_mask;
  mirrored<const float, 2> slopes;
  mirrored<float, 3> lse;
  alibi::attention_params params;
  explicit device_params(const alibi::attention_params& p)
      : q_lengths(p.q_lengths),
        k_lengths(p.k_lengths),
        key_mask(p.key_mask),
        slopes(p.slopes.values),
        lse(p.logsumexp),
        params(p) {
    params.q_lengths = q_lengths.view();
    params.k_lengths = k_lengths.view();
    params.key_mask = key_mask.view();
    params.slopes.values = slopes.view();
    params.logsumexp = lse.view();
  }
};

struct cuda_runner : mpi_cases::runner {
  alibi::backend::cuda be;
  std::string name() const override { return "cuda"; }
  void single(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
              alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
              const alibi::attention_params& params) override {
    const mirrored<const float, 4> dq(q), dk(k), dv(v);
    const mirrored<float, 4> dout(out);
    const device_params dp(params);
    alibi::attention(be, dq.view(), dk.view(), dv.view(), dout.view(), dp.params);
    dout.back();
    dp.lse.back();
  }
  void ring(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
            alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
            const alibi::attention_params& params, const alibi::mpi::ring_options& options,
            alibi::tensor_view<float, 3> lse, alibi::mpi::ring_stats* stats) override {
    const mirrored<const float, 4> dq(q), dk(k), dv(v);
    const mirrored<float, 4> dout(out);
    const mirrored<float, 3> dlse(lse);
    const device_params dp(params);
    alibi::attention_params p = dp.params;
    p.logsumexp = dlse.view();
    alibi::mpi::ring_attention(MPI_COMM_WORLD, be, dq.view(), dk.view(), dv.view(), dout.view(), p,
                               options, stats);
    dout.back();
    dlse.back();
  }
  void alltoall(alibi::tensor_view<const float, 4> q, alibi::tensor_view<const float, 4> k,
                alibi::tensor_view<const float, 4> v, alibi::tensor_view<float, 4> out,
                const alibi::attention_params& params, alibi::tensor_view<float, 3> lse) override {
    const mirrored<const float, 4> dq(q), dk(k), dv(v);
    const mirrored<float, 4> dout(out);
    const mirrored<float, 3> dlse(lse);
    const device_params dp(params);
    alibi::attention_params p = dp.params;
    p.logsumexp = dlse.view();
    alibi::mpi::alltoall_attention(MPI_COMM_WORLD, be, dq.view(), dk.view(), dv.view(), dout.view(),
                                   p);
    dout.back();
    dlse.back();
  }
};

}  // namespace

namespace mpi_cases {

bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<runner> make_cuda_runner() { return std::make_unique<cuda_runner>(); }

}  // namespace mpi_cases

// The tensor-parallel modules on the CUDA backend: compiled here (every member that is not a
// template); their all-reduce staging is the host path's, which the staged_eigen tests run.
template class alibi::mpi::tensor_parallel_layer<float, alibi::backend::cuda>;
template class alibi::mpi::tensor_parallel_attention<float, alibi::backend::cuda>;
// The modules' code lives in their shared base: instantiate it too.
template class alibi::detail::mpi::tensor_parallel_base<
    float, alibi::backend::cuda, alibi::transformer_layer, alibi::layer_config>;
template class alibi::detail::mpi::tensor_parallel_base<
    float, alibi::backend::cuda, alibi::multi_head_attention, alibi::mha_config>;
