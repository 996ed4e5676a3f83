// SPDX-License-Identifier: MIT
// Where each rank's rows lie in the whole sequences, for alibi::mpi: the segments of a ring
// layout (global position, length, first row), the views of a run of rows or heads, the
// mask test of a pair of segments, and the key mask gathered over the whole sequences
// (whole_key_mask, one MPI_Allgatherv).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <limits>
#include <memory>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/bias.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/options.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// One contiguous run of a rank's sequence part: global position `pos`, `len` rows, starting
/// at row `row` of the rank's tensors.
struct segment {
  index_t pos = 0, len = 0, row = 0;
};

/// The segments of rank r (lengths: every rank's sequence length; checked by the caller).
inline std::vector<segment> segments_of(alibi::mpi::ring_layout layout, int r,
                                        const std::vector<index_t>& lengths) {
  std::vector<segment> out;
  for (const alibi::mpi::ring_segment& s : alibi::mpi::ring_segments(layout, r, lengths))
    out.push_back({s.position, s.length, s.row});
  return out;
}

/// Every rank's segments, indexed by rank.
inline std::vector<std::vector<segment>> segments_of_all(alibi::mpi::ring_layout layout,
                                                         const std::vector<index_t>& lengths) {
  std::vector<std::vector<segment>> segs(lengths.size());
  for (std::size_t r = 0; r < lengths.size(); ++r)
    segs[r] = segments_of(layout, static_cast<int>(r), lengths);
  return segs;
}

/// Rows [row, row + len) of a (batch, heads, seq, dim) or (batch, heads, seq) view.
template <class T, int R>
tensor_view<T, R> rows_of(tensor_view<T, R> t, index_t row, index_t len) {
  static_assert(R == 3 || R == 4, "alibi::mpi: rows_of takes (batch, heads, seq[, dim]) views");
  t.data += row * t.strides[2];
  t.extents[2] = len;
  return t;
}

/// Heads [first, first + count) of a (batch, heads, ...) view.
template <class V>
V heads_of(V t, index_t first, index_t count) {
  t.data += first * t.strides[1];
  t.extents[1] = count;
  return t;
}

/// A (batch, heads, rows) view as a (batch, heads, rows, 1) one: a logsumexp as rows of one
/// value, for copy_rows.
template <class T>
tensor_view<T, 4> as_rows(const tensor_view<T, 3>& t) {
  return make_strided_view<T, 4>(t.data, {t.extents[0], t.extents[1], t.extents[2], 1},
                                 {t.strides[0], t.strides[1], t.strides[2], 1});
}

/// Whether an optional view (the key mask, lse) is given: data, or any extent. A rank without
/// rows passes (batch, 0) or (batch, heads, 0), whose data may be null.
template <class V>
bool given(const V& m) {
  if (m.data != nullptr) return true;
  for (int i = 0; i < V::rank; ++i)
    if (m.extents[i] != 0) return true;
  return false;
}

/// The key mask over the whole sequences, (batch, L): every rank's (batch, rows) part of
/// params.key_mask (a host copy) gathered with one MPI_Allgatherv, each rank's rows put at
/// the positions of its segments; place() hands it to the backend (layer_ops::key_mask: the
/// host array itself, or a copy in device memory). Empty when no key mask is given. In three
/// steps, so that a call can check that every rank allocated before the collective:
/// prepare() (the buffers, and this rank's part; may throw), gather() (the collective, on
/// every rank alike: whether a mask is given is agreed), assemble() (may throw).
template <class Backend>
class whole_key_mask {
 public:
  void prepare(const tensor_view<const bool, 2>& mine, index_t B, int rank,
               const std::vector<index_t>& lengths) {
    if (!given(mine)) return;
    const int P = static_cast<int>(lengths.size());
    index_t L = 0;
    counts_.assign(static_cast<std::size_t>(P), 0);
    displs_.assign(counts_.size(), 0);
    for (int r = 0; r < P; ++r) {
      const index_t c = B * lengths[static_cast<std::size_t>(r)];
      if (c + L * B > std::numeric_limits<int>::max())
        raise(argument_error("alibi::mpi: a key mask of more than 2^31 - 1 elements"));
      counts_[static_cast<std::size_t>(r)] = static_cast<int>(c);
      displs_[static_cast<std::size_t>(r)] = static_cast<int>(L * B);
      L += lengths[static_cast<std::size_t>(r)];
    }
    const index_t n = lengths[static_cast<std::size_t>(rank)];
    send_.assign(static_cast<std::size_t>(B * n), 0);
    recv_.assign(static_cast<std::size_t>(B * L), 0);
    host_.reset(new bool[static_cast<std::size_t>(B * L)]);
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < n; ++j)
        send_[static_cast<std::size_t>(b * n + j)] = mine(b, j) ? 1 : 0;
    B_ = B;
    L_ = L;
  }
  /// The collective (when a mask is given: `wanted`, the same on every rank).
  void gather(MPI_Comm comm, bool wanted) {
    if (!wanted) return;
    check_mpi(MPI_Allgatherv(send_.data(), static_cast<int>(send_.size()), MPI_CHAR, recv_.data(),
                             counts_.data(), displs_.data(), MPI_CHAR, comm),
              "MPI_Allgatherv (key mask)");
  }
  void assemble(const std::vector<std::vector<segment>>& segs,
                const std::vector<index_t>& lengths) {
    if (!host_) return;
    for (std::size_t r = 0; r < segs.size(); ++r)
      for (const segment& g : segs[r])
        for (index_t b = 0; b < B_; ++b)
          for (index_t i = 0; i < g.len; ++i)
            host_[static_cast<std::size_t>(b * L_ + g.pos + i)] =
                recv_[static_cast<std::size_t>(displs_[r] + b * lengths[r] + g.row + i)] != 0;
  }
  /// Where the backend reads it (staged backends: a copy, queued on the stream).
  void place(const Backend& be) {
    if (host_)
      whole_ = ops_of<Backend>::key_mask(be, make_view<const bool>(host_.get(), B_, L_), scratch_);
  }
  /// Keys [pos, pos + len) of the whole sequences (global positions), or an empty view.
  tensor_view<const bool, 2> keys(index_t pos, index_t len) const {
    if (whole_.data == nullptr) return {};
    tensor_view<const bool, 2> m = whole_;
    m.data += pos * m.strides[1];
    m.extents[1] = len;
    return m;
  }

 private:
  std::vector<int> counts_, displs_;
  std::vector<char> send_, recv_;
  std::unique_ptr<bool[]> host_;
  index_t B_ = 0, L_ = 0;
  backend_buffer<Backend, bool> scratch_;
  tensor_view<const bool, 2> whole_{};
};

}  // namespace mpi
}  // namespace detail
}  // namespace alibi
