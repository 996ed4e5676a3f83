// SPDX-License-Identifier: MIT
// All-to-all (DeepSpeed-Ulysses) sequence-parallel attention
// (alibi::mpi::alltoall_attention): q, k and v are re-sharded from sequence to heads with
// one MPI_Alltoall each, every rank runs one attention() call over the whole sequences on its
// heads, and the outputs go back from heads to sequence the same way.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
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

/// The buffers of one all-to-all call and its exchanges. Every buffer is allocated by
/// allocate() (checked on every rank before the first exchange); an exchange then packs and
/// unpacks under the call's guard (a failed rank skips them) and always makes its
/// MPI_Alltoall, so a failure on one rank never leaves the others waiting in one.
struct alltoall_buffers {
  std::vector<float> send, recv;  // the largest re-shard, P blocks
  std::vector<float> qh, kh, vh;  // this rank's heads over the whole sequences, (B, h, L, d)
  std::vector<float> oh, lh;      // their outputs and logsumexps

  /// One MPI_Alltoall of P blocks of `block` floats from send to recv.
  void exchange(MPI_Comm comm, std::size_t block, const char* what) {
    check_mpi(MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(),
                           static_cast<int>(block), MPI_FLOAT, comm),
              what);
  }

  /// Sequence -> heads, for t (B, P h_per, n, d), this rank's rows of every head: block p
  /// of the send buffer is this rank's rows of rank p's heads, (B, h_per, n, d); block p of
  /// the receive buffer is rank p's rows of this rank's heads, which are rows [p n, (p + 1)
  /// n) of the whole sequences. Fills `whole`, this rank's heads over the whole sequences,
  /// (B, h_per, n P, d).
  template <class Guard>
  void rows_to_heads(MPI_Comm comm, Guard&& guard, const tensor_view<const float, 4>& t,
                     std::vector<float>& whole, index_t B, index_t n, int P, index_t h_per,
                     index_t d) {
    const std::size_t block = static_cast<std::size_t>(B * h_per * n * d);
    guard([&] {
      for_each_block_row(B, n, P, h_per, d,
                         [&](index_t b, index_t head, index_t i, std::size_t at) {
                           std::memcpy(send.data() + at, t.ptr(b, head, i),
                                       static_cast<std::size_t>(d) * sizeof(float));
                         });
    });
    exchange(comm, block, "MPI_Alltoall (sequence to heads)");
    guard([&] {
      for_each_block_run(
          B, n, P, h_per, d, [&](std::size_t in_blocks, std::size_t in_whole, std::size_t count) {
            std::memcpy(whole.data() + in_whole, recv.data() + in_blocks, count * sizeof(float));
          });
    });
  }

  /// Heads -> sequence, the inverse of rows_to_heads for this rank's hq heads over the whole
  /// sequences, (B, hq, n P, d): block p is rank p's rows of this rank's heads. store(b,
  /// head, i, row) receives each row of this rank's rows, head among all P hq.
  template <class Guard, class Store>
  void heads_to_rows(MPI_Comm comm, Guard&& guard, const std::vector<float>& whole, index_t B,
                     index_t n, int P, index_t hq, index_t d, Store&& store) {
    const std::size_t block = static_cast<std::size_t>(B * hq * n * d);
    guard([&] {
      for_each_block_run(
          B, n, P, hq, d, [&](std::size_t in_blocks, std::size_t in_whole, std::size_t count) {
            std::memcpy(send.data() + in_blocks, whole.data() + in_whole, count * sizeof(float));
          });
    });
    exchange(comm, block, "MPI_Alltoall (heads to sequence)");
    guard([&] {
      for_each_block_row(B, n, P, hq, d, [&](index_t b, index_t head, index_t i, std::size_t at) {
        store(b, head, i, recv.data() + at);
      });
    });
  }
};

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
                        tensor_view<float, 4> out, const attention_params& call_params = {}) {
  namespace dm = alibi::detail::mpi;
  // The rows' logsumexp, if asked for (params.logsumexp), comes back by the second
  // all-to-all: it leaves the params of the calls on the heads.
  attention_params params = call_params;
  const tensor_view<float, 3> lse = params.logsumexp;
  params.logsumexp = {};
  using alibi::detail::str;
  static constexpr const char* fn = "alibi::mpi::alltoall_attention";
  const int rank = dm::comm_rank(comm), P = dm::comm_size(comm);
  using ops = dm::ops_of<Backend>;
  constexpr bool staged = dm::staged<Backend>;
  const dm::host_params host(backend, params);
  std::vector<index_t> lengths;
  // 2 for the layout word: no ring layout, its own kind of call.
  dm::agree(
      comm, fn, backend, q, k, v, out, lse, params, host, 2, false,
      [&] {
        if (q.extents[1] % P != 0 || k.extents[1] % P != 0)
          return std::string(fn) + ": q_heads (" + str(q.extents[1]) + ") and kv_heads (" +
                 str(k.extents[1]) + ") must be multiples of the number of ranks (" +
                 std::to_string(P) + ")";
        if (params.slopes.values.data && params.slopes.values.extents[1] != q.extents[1])
          return std::string(fn) + ": params.slopes.values must have one column per query head";
        // One exchange's block is this rank's rows of one rank's heads: with more query
        // heads than KV heads, q's and out's blocks exceed the K/V part the common check
        // bounds.
        const index_t block = alibi::detail::checked_product(
            {q.extents[0], q.extents[1] / P, q.extents[2], std::max(q.extents[3], v.extents[3])});
        if (block < 0 || block > std::numeric_limits<int>::max())
          return std::string(fn) + ": a block of q or out, batch * q_heads / ranks * rows * " +
                 "head_dim, has more than 2^31 - 1 elements (one MPI message's count)";
        return std::string();
      },
      lengths);
  dm::require_equal_rows(fn, "every rank must hold the same number of rows", lengths);
  const index_t B = q.extents[0], n = q.extents[2], L = n * P, Hq_all = q.extents[1];
  const index_t hq = q.extents[1] / P, hkv = k.extents[1] / P;  // heads per rank
  const index_t Dk = q.extents[3], Dv = v.extents[3];

  // Every failure of this rank from here on (an allocation, a copy, the attention call) is
  // kept and raised on every rank at the next check; meanwhile the rank takes part in every
  // exchange (with whatever its buffers hold).
  dm::call_failure failure;
  auto guard = [&](auto&& f) { dm::guard_all(failure, fn, f); };
  // The buffers, before the first exchange. Staged backends: q, k and v are first copied to
  // host memory, the whole sequences of this rank's heads go back to the backend's memory for
  // the attention() call, and its outputs come to the host for the second all-to-all.
  dm::alltoall_buffers buf;
  std::vector<std::vector<dm::segment>> segs;
  dm::whole_key_mask<Backend> key_mask;
  std::vector<float> q_rows, k_rows, v_rows, out_rows, lse_rows;
  alibi::detail::backend_buffer<Backend, float> qd, kd, vd, od, ld;
  std::vector<index_t> seq_lengths;
  guard([&] {
    segs = dm::segments_of_all(ring_layout::contiguous, lengths);
    key_mask.prepare(host.params.key_mask, B, rank, lengths);
    const index_t blocks = std::max({hq * Dk, hkv * std::max(Dk, Dv), hq * Dv});
    buf.send.resize(static_cast<std::size_t>(B * n * P * blocks));
    buf.recv.resize(buf.send.size());
    buf.qh.resize(static_cast<std::size_t>(B * hq * L * Dk));
    buf.kh.resize(static_cast<std::size_t>(B * hkv * L * Dk));
    buf.vh.resize(static_cast<std::size_t>(B * hkv * L * Dv));
    buf.oh.resize(static_cast<std::size_t>(B * hq * L * Dv));
    buf.lh.resize(static_cast<std::size_t>(B * hq * L));
    if (host.params.k_lengths.data)
      for (index_t b = 0; b < B; ++b) seq_lengths.push_back(host.params.k_lengths(b));
    if constexpr (staged) {
      q_rows.resize(static_cast<std::size_t>(B * Hq_all * n * Dk));
      k_rows.resize(static_cast<std::size_t>(B * k.extents[1] * n * Dk));
      v_rows.resize(static_cast<std::size_t>(B * k.extents[1] * n * Dv));
      out_rows.resize(static_cast<std::size_t>(B * Hq_all * n * Dv));
      if (dm::given(lse)) lse_rows.resize(static_cast<std::size_t>(B * Hq_all * n));
      ops::resize(qd, static_cast<index_t>(buf.qh.size()));
      ops::resize(kd, static_cast<index_t>(buf.kh.size()));
      ops::resize(vd, static_cast<index_t>(buf.vh.size()));
      ops::resize(od, static_cast<index_t>(buf.oh.size()));
      ops::resize(ld, static_cast<index_t>(buf.lh.size()));
    }
  });
  dm::all_succeeded(comm, fn, failure);

  key_mask.gather(comm, dm::given(params.key_mask));
  guard([&] { key_mask.assemble(segs, lengths); });
  if constexpr (staged) {
    auto to_host = [&](tensor_view<const float, 4>& t, std::vector<float>& keep) {
      const index_t h = t.extents[1], d = t.extents[3];
      guard([&] { dm::copy_rows(backend, t, make_view(keep.data(), B, h, n, d)); });
      t = make_view<const float>(keep.data(), B, h, n, d);
    };
    to_host(q, q_rows);
    to_host(k, k_rows);
    to_host(v, v_rows);
    dm::all_succeeded(comm, fn, failure);
  }

  buf.rows_to_heads(comm, guard, q, buf.qh, B, n, P, hq, Dk);
  buf.rows_to_heads(comm, guard, k, buf.kh, B, n, P, hkv, Dk);
  buf.rows_to_heads(comm, guard, v, buf.vh, B, n, P, hkv, Dv);
  // The outputs of this rank's heads, (batch, hq, L, dim), and where the backend computes.
  float *o_at = buf.oh.data(), *l_at = buf.lh.data();
  const float *q_at = buf.qh.data(), *k_at = buf.kh.data(), *v_at = buf.vh.data();
  if constexpr (staged) {
    auto upload = [&](const std::vector<float>& whole,
                      alibi::detail::backend_buffer<Backend, float>& dev) {
      guard([&] {
        dm::stage(backend, whole.data(), dev.data(), static_cast<index_t>(whole.size()));
      });
      return dev.data();
    };
    q_at = upload(buf.qh, qd);
    k_at = upload(buf.kh, kd);
    v_at = upload(buf.vh, vd);
    o_at = od.data();
    l_at = ld.data();
  }
  attention_params p = params;
  // Each sequence's length, for its queries and keys, in the backend's memory.
  alibi::detail::backend_buffer<Backend, index_t> lengths_dev;
  dm::slopes_of_heads(p, params, rank, P, hq);
  if (dm::given(lse)) p.logsumexp = make_view(l_at, B, hq, L);
  guard([&] {
    if (host.params.k_lengths.data)
      p.q_lengths = p.k_lengths = ops::per_batch(backend, seq_lengths, lengths_dev);
    key_mask.place(backend);
    p.key_mask = key_mask.keys(0, L);
    attention(backend, make_view<const float>(q_at, B, hq, L, Dk),
              make_view<const float>(k_at, B, hkv, L, Dk),
              make_view<const float>(v_at, B, hkv, L, Dv), make_view(o_at, B, hq, L, Dv), p);
    if constexpr (staged) {
      dm::stage(backend, static_cast<const float*>(o_at), buf.oh.data(),
                static_cast<index_t>(buf.oh.size()));
      if (dm::given(lse))
        dm::stage(backend, static_cast<const float*>(l_at), buf.lh.data(),
                  static_cast<index_t>(buf.lh.size()));
      ops::fence(backend);
    }
  });
  if constexpr (staged) dm::all_succeeded(comm, fn, failure);

  // Staged backends: into host rows of out's and lse's shape, then copied to them.
  tensor_view<float, 4> out_h = out;
  tensor_view<float, 3> lse_h = lse;
  if constexpr (staged) {
    out_h = make_view(out_rows.data(), B, Hq_all, n, Dv);
    if (dm::given(lse)) lse_h = make_view(lse_rows.data(), B, Hq_all, n);
  }
  buf.heads_to_rows(
      comm, guard, buf.oh, B, n, P, hq, Dv, [&](index_t b, index_t h, index_t i, const float* src) {
        std::memcpy(out_h.ptr(b, h, i), src, static_cast<std::size_t>(Dv) * sizeof(float));
      });
  if (dm::given(lse))
    buf.heads_to_rows(
        comm, guard, buf.lh, B, n, P, hq, 1,
        [&](index_t b, index_t h, index_t i, const float* src) { lse_h(b, h, i) = *src; });
  if constexpr (staged)
    guard([&] {
      dm::copy_rows(backend, tensor_view<const float, 4>(out_h), out, false);
      if (dm::given(lse))
        dm::copy_rows(backend, dm::as_rows<const float>(lse_h), dm::as_rows(lse), false);
      ops::fence(backend);
    });
  dm::all_succeeded(comm, fn, failure);
}

}  // namespace mpi
}  // namespace alibi
