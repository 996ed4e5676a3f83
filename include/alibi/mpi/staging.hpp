// SPDX-License-Identifier: MIT
// Host staging for alibi::mpi: MPI reads and writes host memory, so a backend that computes
// in device memory (backend::cuda) has the parts MPI moves copied between the two memories.
// Holds the staged<Backend> predicate, the row and block copies (copy_rows, stage) and the
// host copies of the parameters the planning reads (host_params). No MPI calls here.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_ops.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// Whether the MPI functions stage a backend's tensors through host memory. A backend that
/// computes in device memory has its parts copied (layer_ops<Backend>::stage_rows), and the
/// planning (lengths, norms, the far-chunk bound) reads host copies. Host backends compute
/// on the buffers MPI fills, without copies.
template <class Backend>
inline constexpr bool staged = !reads_host_memory<Backend>;

template <class Backend>
using ops_of = layer_ops<Backend>;

/// dst = src, two (batch, heads, rows, dim) views of one shape whose rows are contiguous
/// (stride(3) 1). Host backends: host memory, copied here. Staged backends: each side in host
/// memory or the backend's (stage_rows tells the direction from the pointers), one strided
/// copy per (batch, head), queued on the backend's stream; `wait` waits for it (needed before
/// the host reads rows it wrote, or reuses rows it read).
template <class Backend>
void copy_rows(const Backend& be, const tensor_view<const float, 4>& src,
               const tensor_view<float, 4>& dst, bool wait = true) {
  const index_t B = src.extents[0], H = src.extents[1], n = src.extents[2], d = src.extents[3];
  if (B <= 0 || H <= 0 || n <= 0 || d <= 0) return;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      if constexpr (staged<Backend>)
        ops_of<Backend>::stage_rows(be, src.ptr(b, h, 0), src.strides[2], dst.ptr(b, h, 0),
                                    dst.strides[2], n, d);
      else
        for (index_t i = 0; i < n; ++i)
          std::memcpy(dst.ptr(b, h, i), src.ptr(b, h, i),
                      static_cast<std::size_t>(d) * sizeof(float));
    }
  if constexpr (staged<Backend>)
    if (wait) ops_of<Backend>::fence(be);
}

/// count contiguous values between host memory and a staged backend's, either way, queued
/// (the caller fences).
template <class Backend, class T>
void stage(const Backend& be, const T* src, T* dst, index_t count) {
  static_assert(staged<Backend>, "alibi::mpi: stage() is for staged backends");
  if (count > 0) ops_of<Backend>::stage_rows(be, src, count, dst, count, 1, count);
}

/// The values the MPI functions plan with on the host: params.q_lengths, k_lengths, caller
/// slopes and the key mask. Host backends: params itself. Staged backends: copies of those
/// views (which may be in either memory), and `params` points at the copies; a copy that
/// fails is `error`, which the caller reports through the ranks' agreement rather than
/// raising on one rank alone.
struct host_params {
  attention_params params;
  std::string error;

  template <class Backend>
  host_params(const Backend& be, const attention_params& p) : params(p) {
    if constexpr (staged<Backend>) {
      try {
        copy_all(be);
      } catch (const std::exception& e) {  // alibi::error, or the backend's (cuda_error)
        error = e.what();
        // Nothing may read the caller's views on the host now (they may be device memory).
        params.q_lengths = params.k_lengths = {};
        params.slopes.values = {};
        params.key_mask = {};
      }
    } else {
      (void)be;
    }
  }
  host_params(const host_params&) = delete;  // params points into this object
  host_params& operator=(const host_params&) = delete;

 private:
  template <class Backend>
  void copy_all(const Backend& be) {
    using ops = ops_of<Backend>;
    auto lengths = [&](tensor_view<const index_t, 1>& view, std::vector<index_t>& keep) {
      if (view.data == nullptr || view.extents[0] <= 0) return;
      keep.resize(static_cast<std::size_t>(view.extents[0]));
      ops::stage_rows(be, view.data, view.strides[0], keep.data(), index_t(1), view.extents[0],
                      index_t(1));
      view = make_view<const index_t>(keep.data(), view.extents[0]);
    };
    lengths(params.q_lengths, q_lengths_);
    lengths(params.k_lengths, k_lengths_);
    tensor_view<const float, 2>& s = params.slopes.values;
    if (s.data != nullptr && s.extents[0] > 0 && s.extents[1] > 0) {
      const index_t rows = s.extents[0], heads = s.extents[1];
      slopes_.resize(static_cast<std::size_t>(rows * heads));
      for (index_t b = 0; b < rows; ++b)
        ops::stage_rows(be, s.data + b * s.strides[0], s.strides[1], slopes_.data() + b * heads,
                        index_t(1), heads, index_t(1));
      s = make_view<const float>(slopes_.data(), rows, heads);
    }
    tensor_view<const bool, 2>& m = params.key_mask;
    if (m.data != nullptr && m.extents[0] > 0 && m.extents[1] > 0) {
      const index_t rows = m.extents[0], cols = m.extents[1];
      key_mask_.reset(new bool[static_cast<std::size_t>(rows * cols)]);
      for (index_t b = 0; b < rows; ++b)
        ops::stage_rows(be, m.data + b * m.strides[0], m.strides[1], key_mask_.get() + b * cols,
                        index_t(1), cols, index_t(1));
      m = make_view<const bool>(key_mask_.get(), rows, cols);
    }
    ops::fence(be);
  }

  std::vector<index_t> q_lengths_, k_lengths_;
  std::vector<float> slopes_;
  std::unique_ptr<bool[]> key_mask_;
};

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
