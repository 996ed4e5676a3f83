// SPDX-License-Identifier: MIT
// All-to-all (DeepSpeed-Ulysses) sequence-parallel attention
// (alibi::mpi::alltoall_attention): q, k and v are re-sharded from sequence to heads with
// one MPI_Alltoall each, every rank runs one attention() call over the whole sequences on its
// heads, and the outputs go back from heads to sequence the same way.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "alibi/attention.hpp"
#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/mpi/agreement.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/layout.hpp"
#include "alibi/mpi/options.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

/// One MPI_Alltoall of P blocks of `block` floats: fill(send) writes the send buffer (block
/// p for rank p); returns the receive buffer (block p from rank p).
template <class Fill>
std::vector<float> exchange_blocks(MPI_Comm comm, std::size_t block, int P, const char* what,
                                   Fill&& fill) {
  std::vector<float> send(block * static_cast<std::size_t>(P)), recv(send.size());
  fill(send.data());
  check_mpi(MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(),
                         static_cast<int>(block), MPI_FLOAT, comm),
            what);
  return recv;
}

/// P blocks of (B, h, n, d) floats, block p holding rows of heads [p h, (p + 1) h): f(b,
/// head, i, offset) for row i of each head, at `offset` in the blocks.
template <class F>
void for_each_block_row(index_t B, index_t n, int P, index_t h, index_t d, F&& f) {
  const std::size_t block = static_cast<std::size_t>(B * h * n * d);
  for (int p = 0; p < P; ++p)
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < h; ++j)
        for (index_t i = 0; i < n; ++i)
          f(b, p * h + j, i, p * block + static_cast<std::size_t>(((b * h + j) * n + i) * d));
}

/// The runs of n rows of d floats that P blocks of (B, h, n, d) (block p: rows [p n, (p + 1)
/// n)) and the whole sequences (B, h, n P, d) share: f(offset in the blocks, offset in the
/// whole sequences, floats) for each.
template <class F>
void for_each_block_run(index_t B, index_t n, int P, index_t h, index_t d, F&& f) {
  const index_t L = n * P;
  const std::size_t block = static_cast<std::size_t>(B * h * n * d);
  for (int p = 0; p < P; ++p)
    for (index_t b = 0; b < B; ++b)
      for (index_t j = 0; j < h; ++j)
        f(p * block + static_cast<std::size_t>((b * h + j) * n * d),
          static_cast<std::size_t>(((b * h + j) * L + p * n) * d), static_cast<std::size_t>(n * d));
}

/// Sequence -> heads, for t (B, P h_per, n, d), this rank's rows of every head: block p of
/// the send buffer is this rank's rows of rank p's heads, (B, h_per, n, d); block p of the
/// receive buffer is rank p's rows of this rank's heads, which are rows [p n, (p + 1) n) of
/// the whole sequences. Returns this rank's heads over the whole sequences, (B, h_per, n P,
/// d).
inline std::vector<float> rows_to_heads(MPI_Comm comm, const tensor_view<const float, 4>& t,
                                        index_t B, index_t n, int P, index_t h_per, index_t d) {
  const std::size_t block = static_cast<std::size_t>(B * h_per * n * d);
  const std::vector<float> recv =
      exchange_blocks(comm, block, P, "MPI_Alltoall (sequence to heads)", [&](float* send) {
        for_each_block_row(B, n, P, h_per, d,
                           [&](index_t b, index_t head, index_t i, std::size_t at) {
                             std::memcpy(send + at, t.ptr(b, head, i),
                                         static_cast<std::size_t>(d) * sizeof(float));
                           });
      });
  std::vector<float> whole(recv.size());  // (batch, h_per, L, d)
  for_each_block_run(
      B, n, P, h_per, d, [&](std::size_t in_blocks, std::size_t in_whole, std::size_t count) {
        std::memcpy(whole.data() + in_whole, recv.data() + in_blocks, count * sizeof(float));
      });
  return whole;
}

/// Heads -> sequence, the inverse of rows_to_heads for this rank's hq heads over the whole
/// sequences, (B, hq, n P, d): block p is rank p's rows of this rank's heads. store(b, head,
/// i, row) receives each row of this rank's rows, head among all P hq.
template <class Store>
void heads_to_rows(MPI_Comm comm, const std::vector<float>& whole, index_t B, index_t n, int P,
                   index_t hq, index_t d, Store&& store) {
  const std::size_t block = static_cast<std::size_t>(B * hq * n * d);
  const std::vector<float> recv =
      exchange_blocks(comm, block, P, "MPI_Alltoall (heads to sequence)", [&](float* send) {
        for_each_block_run(
            B, n, P, hq, d, [&](std::size_t in_blocks, std::size_t in_whole, std::size_t count) {
              std::memcpy(send + in_blocks, whole.data() + in_whole, count * sizeof(float));
            });
      });
  for_each_block_row(B, n, P, hq, d, [&](index_t b, index_t head, index_t i, std::size_t at) {
    store(b, head, i, recv.data() + at);
  });
}

/// The slopes of this rank's heads [rank hq, (rank + 1) hq) of P hq: its columns of caller
/// slopes, or the global heads' offset.
inline void slopes_of_heads(attention_params& p, const attention_params& params, int rank, int P,
                            index_t hq) {
  if (p.slopes.values.data) {
    p.slopes.values.data += rank * hq * p.slopes.values.strides[1];
    p.slopes.values.extents[1] = hq;
  } else {
    p.slopes.global_heads = params.slopes.global_heads > 0 ? params.slopes.global_heads : hq * P;
    p.slopes.head_offset = params.slopes.head_offset + rank * hq;
  }
}

}  // namespace mpi
}  // namespace detail

namespace mpi {

/// All-to-all (DeepSpeed-Ulysses) sequence-parallel self-attention: the same arguments and
/// layout as ring_attention with contiguous parts of equal length n on every rank, and q_heads
/// and kv_heads divisible by the number of ranks P. q, k and v are re-sharded from sequence
/// to heads with MPI_Alltoall (rank r then holds heads [r Hq / P, (r + 1) Hq / P) of the whole
/// sequences, and their kv heads), each rank runs one attention() call over the whole
/// sequences on its heads with their global slopes (slopes.head_offset and global_heads, or
/// its columns of caller slopes), and the outputs (and logsumexps) go back by a second
/// all-to-all. params.k_lengths and key_mask: as for ring_attention. One call per rank sees the
/// whole sequence, so far-tile skipping is as effective as in one process; each rank sends and
/// receives (P - 1) / P of its q, k, v and out. Backends as for ring_attention: with backend::cuda
/// the rows go to host buffers for MPI_Alltoall, the whole sequences of the rank's heads to the
/// device for the attention() call, and the outputs back the same way.
template <class Backend>
void alltoall_attention(MPI_Comm comm, const Backend& backend, tensor_view<const float, 4> q,
                        tensor_view<const float, 4> k, tensor_view<const float, 4> v,
                        tensor_view<float, 4> out, const attention_params& params = {},
                        tensor_view<float, 3> lse = {}) {
  namespace dm = alibi::detail::mpi;
  using alibi::detail::str;
  const std::string fn = "alibi::mpi::alltoall_attention";
  const int rank = dm::comm_rank(comm), P = dm::comm_size(comm);
  using ops = dm::ops_of<Backend>;
  constexpr bool staged = dm::staged<Backend>;
  const dm::host_params host(backend, params);
  std::string refusal;
  if (q.extents[1] % P != 0 || k.extents[1] % P != 0)
    refusal = fn + ": q_heads (" + str(q.extents[1]) + ") and kv_heads (" + str(k.extents[1]) +
              ") must be multiples of the number of ranks (" + std::to_string(P) + ")";
  else if (params.slopes.values.data && params.slopes.values.extents[1] != q.extents[1])
    refusal = fn + ": params.slopes.values must have one column per query head";
  // 2 for the layout word: no ring layout, its own kind of call.
  const std::vector<index_t> lengths =
      dm::agree(comm, fn, backend, q, k, v, out, lse, params, host, 2, false, refusal);
  dm::require_equal_rows(fn, "every rank must hold the same number of rows", lengths);
  const index_t B = q.extents[0], n = q.extents[2], L = n * P, Hq_all = q.extents[1];
  const index_t hq = q.extents[1] / P, hkv = k.extents[1] / P;  // heads per rank
  const index_t Dk = q.extents[3], Dv = v.extents[3];
  dm::whole_key_mask<Backend> key_mask(comm, host.params.key_mask, B,
                                       dm::segments_of_all(ring_layout::contiguous, lengths),
                                       lengths);

  // Staged backends: q, k and v are first copied to host memory, the whole sequences of this
  // rank's heads go back to the backend's memory for the attention() call, and its outputs
  // come to the host for the second all-to-all. A failure there on one rank is raised on
  // every rank (all_succeeded) before the next all-to-all.
  std::string failure;
  auto guard = [&](auto&& f) { dm::guarded<Backend>(failure, fn, f); };
  std::vector<float> q_rows, k_rows, v_rows;
  if constexpr (staged) {
    auto to_host = [&](tensor_view<const float, 4>& t, std::vector<float>& keep) {
      const index_t h = t.extents[1], d = t.extents[3];
      guard([&] {
        keep.resize(static_cast<std::size_t>(B * h * n * d));
        dm::copy_rows(backend, t, make_view(keep.data(), B, h, n, d));
      });
      t = make_view<const float>(keep.data(), B, h, n, d);
    };
    to_host(q, q_rows);
    to_host(k, k_rows);
    to_host(v, v_rows);
    dm::all_succeeded(comm, fn, failure);
  }

  const std::vector<float> qh = dm::rows_to_heads(comm, q, B, n, P, hq, Dk),
                           kh = dm::rows_to_heads(comm, k, B, n, P, hkv, Dk),
                           vh = dm::rows_to_heads(comm, v, B, n, P, hkv, Dv);
  // The outputs of this rank's heads, (batch, hq, L, dim), and where the backend computes.
  std::vector<float> oh(static_cast<std::size_t>(B * hq * L * Dv));
  std::vector<float> lh(static_cast<std::size_t>(B * hq * L));
  alibi::detail::backend_buffer<Backend, float> qd, kd, vd, od, ld;
  float *o_at = oh.data(), *l_at = lh.data();
  const float *q_at = qh.data(), *k_at = kh.data(), *v_at = vh.data();
  if constexpr (staged)
    guard([&] {
      auto upload = [&](const std::vector<float>& whole,
                        alibi::detail::backend_buffer<Backend, float>& dev) {
        ops::resize(dev, static_cast<index_t>(whole.size()));
        dm::stage(backend, whole.data(), dev.data(), static_cast<index_t>(whole.size()));
        return dev.data();
      };
      q_at = upload(qh, qd);
      k_at = upload(kh, kd);
      v_at = upload(vh, vd);
      ops::resize(od, static_cast<index_t>(oh.size()));
      ops::resize(ld, static_cast<index_t>(lh.size()));
      o_at = od.data();
      l_at = ld.data();
    });
  attention_params p = params;
  // Each sequence's length, for its queries and keys, in the backend's memory.
  std::vector<index_t> seq_lengths;
  alibi::detail::backend_buffer<Backend, index_t> lengths_dev;
  dm::slopes_of_heads(p, params, rank, P, hq);
  if (dm::given(lse)) p.logsumexp = make_view(l_at, B, hq, L);
  guard([&] {
    if (host.params.k_lengths.data) {
      for (index_t b = 0; b < B; ++b) seq_lengths.push_back(host.params.k_lengths(b));
      p.q_lengths = p.k_lengths = ops::per_batch(backend, seq_lengths, lengths_dev);
    }
    key_mask.place(backend);
    p.key_mask = key_mask.keys(0, L);
    attention(backend, make_view<const float>(q_at, B, hq, L, Dk),
              make_view<const float>(k_at, B, hkv, L, Dk),
              make_view<const float>(v_at, B, hkv, L, Dv), make_view(o_at, B, hq, L, Dv), p);
    if constexpr (staged) {
      dm::stage(backend, static_cast<const float*>(o_at), oh.data(),
                static_cast<index_t>(oh.size()));
      if (dm::given(lse))
        dm::stage(backend, static_cast<const float*>(l_at), lh.data(),
                  static_cast<index_t>(lh.size()));
      ops::fence(backend);
    }
  });
  if constexpr (staged) dm::all_succeeded(comm, fn, failure);

  // Staged backends: into host rows of out's and lse's shape, then copied to them.
  std::vector<float> out_rows, lse_rows;
  tensor_view<float, 4> out_h = out;
  tensor_view<float, 3> lse_h = lse;
  if constexpr (staged) {
    out_rows.resize(static_cast<std::size_t>(B * Hq_all * n * Dv));
    out_h = make_view(out_rows.data(), B, Hq_all, n, Dv);
    if (dm::given(lse)) {
      lse_rows.resize(static_cast<std::size_t>(B * Hq_all * n));
      lse_h = make_view(lse_rows.data(), B, Hq_all, n);
    }
  }
  dm::heads_to_rows(
      comm, oh, B, n, P, hq, Dv, [&](index_t b, index_t h, index_t i, const float* src) {
        std::memcpy(out_h.ptr(b, h, i), src, static_cast<std::size_t>(Dv) * sizeof(float));
      });
  if (dm::given(lse))
    dm::heads_to_rows(
        comm, lh, B, n, P, hq, 1,
        [&](index_t b, index_t h, index_t i, const float* src) { lse_h(b, h, i) = *src; });
  if constexpr (staged) {
    guard([&] {
      dm::copy_rows(backend, tensor_view<const float, 4>(out_h), out, false);
      if (dm::given(lse))
        dm::copy_rows(backend, dm::as_rows<const float>(lse_h), dm::as_rows(lse), false);
      ops::fence(backend);
    });
    dm::all_succeeded(comm, fn, failure);
  }
}

}  // namespace mpi
}  // namespace alibi
