// SPDX-License-Identifier: MIT
// Device-side test machinery for the CUDA backend: device copies of the shared test cases
// (same layouts, NaN padding and guards, converted to the element type), and the runner
// that compares the CUDA result with the double-precision oracle.
#pragma once

#include <cuda_runtime.h>

#include <alibi/cuda.cuh>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.hpp"

namespace alibi_test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Host <-> element type conversions (round to nearest even), NaN kept.
template <class T>
T to_element(float x) {
  if constexpr (std::is_same<T, float>::value)
    return x;
  else if constexpr (std::is_same<T, __half>::value)
    return __float2half_rn(x);
  else
    return __float2bfloat16_rn(x);
}
template <class T>
float from_element(T x) {
  if constexpr (std::is_same<T, float>::value)
    return x;
  else if constexpr (std::is_same<T, __half>::value)
    return __half2float(x);
  else
    return __bfloat162float(x);
}
template <class T>
float round_to(float x) {
  return from_element<T>(to_element<T>(x));
}
/// Machine epsilon of the element type (0 for float: the fp32 rule needs no extra floor).
template <class T>
constexpr double element_eps() {
  return std::is_same<T, float>::value ? 0.0 : std::is_same<T, __half>::value ? 0x1p-10 : 0x1p-7;
}
template <class T>
const char* element_name() {
  return std::is_same<T, float>::value ? "float" : std::is_same<T, __half>::value ? "half" : "bf16";
}

/// A device buffer holding a copy of a host vector.
template <class T>
struct device_buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  device_buffer() = default;
  explicit device_buffer(const std::vector<T>& host) : n(host.size()) {
    cuda_ok(cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(T)), "cudaMalloc");
    if (n) cuda_ok(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(ptr); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) cuda_ok(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

/// The same view over a device copy of the buffer it points into.
template <class TD, class TH, class TB, int R>
alibi::tensor_view<TD, R> rebase(const alibi::tensor_view<TH, R>& v, const TB* host_base,
                                 TD* device_base) {
  alibi::tensor_view<TD, R> d;
  d.data = v.data ? device_base + (v.data - host_base) : nullptr;
  for (int i = 0; i < R; ++i) {
    d.extents[i] = v.extents[i];
    d.strides[i] = v.strides[i];
  }
  return d;
}

template <class T>
std::vector<T> convert(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = to_element<T>(x[i]);
  return y;
}

/// Rounds the case's inputs to T in place (the oracle then sees exactly what the device does).
template <class T>
void round_inputs(case_data& c) {
  for (auto* t : {&c.q, &c.k, &c.v})
    for (float& x : t->buf) x = round_to<T>(x);
}

/// The case's tensors and per-batch arrays on the device, and the params pointing at them.
template <class T>
struct device_case {
  device_buffer<T> q, k, v;
  device_buffer<index_t> q_lengths, k_lengths, q_offsets, k_offsets;
  device_buffer<char> key_mask;
  device_buffer<float> slopes;
  alibi::tensor_view<const T, 4> qv, kv, vv;
  alibi::attention_params params;

  explicit device_case(const case_data& c)
      : q(convert<T>(c.q.buf)),
        k(convert<T>(c.k.buf)),
        v(convert<T>(c.v.buf)),
        q_lengths(c.q_lengths),
        k_lengths(c.k_lengths),
        q_offsets(c.q_offsets),
        k_offsets(c.k_offsets),
        key_mask(c.key_mask),
        slopes(c.slopes) {
    qv = rebase<const T>(c.q.view, c.q.buf.data(), q.ptr);
    kv = rebase<const T>(c.k.view, c.k.buf.data(), k.ptr);
    vv = rebase<const T>(c.v.view, c.v.buf.data(), v.ptr);
    params = c.params;
    params.q_lengths = rebase<const index_t>(c.params.q_lengths, c.q_lengths.data(), q_lengths.ptr);
    params.k_lengths = rebase<const index_t>(c.params.k_lengths, c.k_lengths.data(), k_lengths.ptr);
    params.q_offsets = rebase<const index_t>(c.params.q_offsets, c.q_offsets.data(), q_offsets.ptr);
    params.k_offsets = rebase<const index_t>(c.params.k_offsets, c.k_offsets.data(), k_offsets.ptr);
    params.key_mask =
        rebase<const bool>(c.params.key_mask, reinterpret_cast<const bool*>(c.key_mask.data()),
                           reinterpret_cast<const bool*>(key_mask.ptr));
    params.slopes.values = rebase<const float>(c.params.slopes.values, c.slopes.data(), slopes.ptr);
  }
};

/// The sentinel the output buffers start with: exact in float, half and bfloat16.
inline constexpr float sentinel = 640.0f;

/// Runs `run(backend, q, k, v, out, params)` (by default alibi::attention) on the case's
/// data (its inputs rounded to T in place) and compares with the oracle.
template <class T, class Run>
comparison check_cuda_data(case_data& c, cudaStream_t stream, Run&& run) {
  const case_spec& spec = c.spec;
  round_inputs<T>(c);
  const oracle_result ref = run_oracle(c);
  const naive_result naive = run_naive(c, [](float x) { return round_to<T>(x); });
  device_case<T> dc(c);
  padded_tensor<float> out(spec.batch, spec.hq, spec.lq, spec.v_dim(), spec.bshd, sentinel);
  device_buffer<T> out_d(convert<T>(out.buf));
  std::vector<float> lse(static_cast<std::size_t>(spec.batch * spec.hq * spec.lq + 1), sentinel);
  device_buffer<float> lse_d(lse);
  alibi::attention_params p = dc.params;
  p.logsumexp = alibi::make_view(lse_d.ptr, spec.batch, spec.hq, spec.lq);
  run(alibi::backend::cuda{stream}, dc.qv, dc.kv, dc.vv,
      rebase<T>(out.view, out.buf.data(), out_d.ptr), p);
  cuda_ok(cudaStreamSynchronize(stream), "attention");
  const std::vector<T> out_h = out_d.download();
  for (std::size_t i = 0; i < out_h.size(); ++i) out.buf[i] = from_element<T>(out_h[i]);
  lse = lse_d.download();
  comparison r = compare(c, ref, naive, out, lse, element_eps<T>());
  if (lse.back() != sentinel) ++r.guard_writes;
  return r;
}

/// check_cuda_data on the case a spec describes.
template <class T, class Run>
comparison check_cuda_with(const case_spec& spec, cudaStream_t stream, Run&& run) {
  case_data c(spec);
  return check_cuda_data<T>(c, stream, std::forward<Run>(run));
}

/// The backend with far-tile skipping engaged at every length (it is opt-in, from 16384
/// keys, by default).
inline alibi::backend::cuda skipping(alibi::backend::cuda be) {
  be.far_tile_skipping = true;
  be.skip_min_keys = 0;
  return be;
}

/// Runs the CUDA backend through alibi::attention on a case and compares with the oracle;
/// `skip`: with far-tile skipping engaged.
template <class T>
comparison check_cuda(const case_spec& spec, cudaStream_t stream = nullptr, bool skip = false) {
  return check_cuda_with<T>(
      spec, stream,
      [skip](const alibi::backend::cuda& be, const auto& q, const auto& k, const auto& v,
             const auto& out, const alibi::attention_params& params) {
        alibi::attention(skip ? skipping(be) : be, q, k, v, out, params);
      });
}

/// A host_call (common.hpp) moved to device memory. A view inside one of the call's listed
/// buffers points into a device copy of the whole buffer (padding, NaN gaps and guards as on
/// the host); any other view gets a device buffer of its span, NaN bytes except its own
/// elements, which are copied row by row (so a view 8 GiB across with few rows costs only
/// its rows). download() copies the buffers that hold a written view back whole, and the
/// other written views row by row.
class device_staging {
 public:
  explicit device_staging(std::vector<host_region> regions)
      : regions_(std::move(regions)),
        copies_(regions_.size(), nullptr),
        written_(regions_.size(), false) {}
  device_staging(const device_staging&) = delete;
  device_staging& operator=(const device_staging&) = delete;
  ~device_staging() {
    for (void* p : allocations_) cudaFree(p);
  }

  template <class T, int R>
  alibi::tensor_view<T, R> stage(const alibi::tensor_view<T, R>& v, bool written) {
    using E = std::remove_const_t<T>;
    if (v.data == nullptr) return v;
    // The span [lo, hi) of element offsets the view reaches; [0, 1) for an empty view.
    index_t lo = 0, hi = 1;
    bool empty = false;
    for (int d = 0; d < R; ++d) {
      if (v.extents[d] == 0) empty = true;
      const index_t reach = (v.extents[d] - 1) * v.strides[d];
      (reach < 0 ? lo : hi) += reach;
    }
    if (empty) {
      lo = 0;
      hi = 1;
    }
    const auto at = reinterpret_cast<std::uintptr_t>(v.data);
    const std::uintptr_t first = at - static_cast<std::uintptr_t>(-lo) * sizeof(E);
    const std::uintptr_t last = at + static_cast<std::uintptr_t>(hi) * sizeof(E);
    for (std::size_t r = 0; r < regions_.size(); ++r) {
      const auto begin = reinterpret_cast<std::uintptr_t>(regions_[r].data);
      if (begin <= first && last <= begin + regions_[r].bytes) {
        if (written) written_[r] = true;
        return rebased(v, reinterpret_cast<std::uintptr_t>(region_copy(r)) + (at - begin));
      }
    }
    const std::size_t bytes = static_cast<std::size_t>(hi - lo) * sizeof(E);
    char* span = allocate(bytes);
    cuda_ok(cudaMemset(span, 0xff, bytes), "cudaMemset (staging)");  // NaN in every gap
    const std::uintptr_t dev =
        reinterpret_cast<std::uintptr_t>(span) + static_cast<std::uintptr_t>(-lo) * sizeof(E);
    if (!empty) {
      copy_rows(v, dev, true);
      if (written) write_back_.push_back([v, dev] { copy_rows(v, dev, false); });
    }
    return rebased(v, dev);
  }

  /// Copies every written view back to the host (after the device work has finished).
  void download() {
    for (std::size_t r = 0; r < regions_.size(); ++r)
      if (written_[r] && copies_[r])
        cuda_ok(cudaMemcpy(const_cast<void*>(regions_[r].data), copies_[r], regions_[r].bytes,
                           cudaMemcpyDeviceToHost),
                "download (staging)");
    for (auto& f : write_back_) f();
  }

 private:
  char* allocate(std::size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw staging_refused("cudaMalloc of " + std::to_string(bytes) + " bytes failed");
    }
    cuda_ok(e, "cudaMalloc (staging)");
    allocations_.push_back(p);
    return static_cast<char*>(p);
  }
  char* region_copy(std::size_t r) {
    if (!copies_[r]) {
      copies_[r] = allocate(regions_[r].bytes);
      cuda_ok(cudaMemcpy(copies_[r], regions_[r].data, regions_[r].bytes, cudaMemcpyHostToDevice),
              "upload (staging)");
    }
    return copies_[r];
  }
  template <class T, int R>
  static alibi::tensor_view<T, R> rebased(alibi::tensor_view<T, R> v, std::uintptr_t dev) {
    v.data = reinterpret_cast<T*>(dev);
    return v;
  }
  /// Copies the view's elements between the host and the device copy whose element 0 is at
  /// `dev`: contiguous rows along the last dimension where its stride is 1.
  template <class T, int R>
  static void copy_rows(const alibi::tensor_view<T, R>& v, std::uintptr_t dev, bool to_device) {
    using E = std::remove_const_t<T>;
    auto copy = [&](index_t offset, index_t count) {
      E* host = const_cast<E*>(v.data) + offset;
      void* device = reinterpret_cast<void*>(dev + static_cast<std::uintptr_t>(offset) * sizeof(E));
      const std::size_t n = static_cast<std::size_t>(count) * sizeof(E);
      cuda_ok(to_device ? cudaMemcpy(device, host, n, cudaMemcpyHostToDevice)
                        : cudaMemcpy(host, device, n, cudaMemcpyDeviceToHost),
              "row copy (staging)");
    };
    index_t idx[R] = {};
    const index_t n = v.extents[R - 1], s = v.strides[R - 1];
    for (;;) {
      index_t offset = 0;
      for (int d = 0; d + 1 < R; ++d) offset += idx[d] * v.strides[d];
      if (s == 1)
        copy(offset, n);
      else
        for (index_t j = 0; j < n; ++j) copy(offset + j * s, 1);
      int d = R - 2;
      for (; d >= 0; --d) {
        if (++idx[d] < v.extents[d]) break;
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }

  std::vector<host_region> regions_;
  std::vector<char*> copies_;
  std::vector<bool> written_;
  std::vector<void*> allocations_;
  std::vector<std::function<void()>> write_back_;
};

/// The runner of the shared edge-case bodies (edge_cases.hpp) on the CUDA backend in float:
/// stages the call's host data on the device (device_staging), runs alibi::attention with
/// backend::cuda on the default stream, synchronizes and copies out and logsumexp back.
struct cuda_float_runner {
  static constexpr const char* name = "cuda(float)";
  static constexpr bool on_device = true;
  using dims = alibi::cuda_detail::kernel_head_dims;

  /// The kernels are built for the head dims of kernel_head_dims, with v_head_dim ==
  /// head_dim; any other call is an alibi::error.
  static bool supports_head_dim(index_t d, index_t dv) { return dims::contains(d) && dv == d; }
  /// The smallest head dim the kernels are built for that is >= d (the largest if none is).
  static index_t head_dim(index_t d) {
    for (int x : dims::list)
      if (x >= d) return x;
    return dims::list[dims::count - 1];
  }

  static void attention(const host_call& call) {
    device_staging st(call.regions);
    alibi::attention_params p = call.params;
    p.q_lengths = st.stage(p.q_lengths, false);
    p.k_lengths = st.stage(p.k_lengths, false);
    p.q_offsets = st.stage(p.q_offsets, false);
    p.k_offsets = st.stage(p.k_offsets, false);
    p.key_mask = st.stage(p.key_mask, false);
    p.slopes.values = st.stage(p.slopes.values, false);
    p.key_norm_bounds = st.stage(p.key_norm_bounds, false);
    p.logsumexp = st.stage(p.logsumexp, true);
    const auto q = st.stage(call.q, false);
    const auto k = st.stage(call.k, false);
    const auto v = st.stage(call.v, false);
    const auto out = st.stage(call.out, true);
    alibi::attention(alibi::backend::cuda{}, q, k, v, out, p);
    cuda_ok(cudaDeviceSynchronize(), "attention");
    st.download();
  }
};

}  // namespace alibi_test
