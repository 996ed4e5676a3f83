// SPDX-License-Identifier: MIT
// Megatron tensor parallelism over MPI (alibi::mpi::tensor_parallel_layer and
// tensor_parallel_attention): each rank holds a shard of a Transformer layer or of a
// multi-head attention module, and the partial sums of the row-parallel projections are
// summed over the ranks with MPI_Allreduce (allreduce_rows, staged through host memory for a
// device backend, with the failure flags that keep one rank's failure from hanging the rest).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "alibi/core/error.hpp"
#include "alibi/core/tensor_view.hpp"
#include "alibi/layer_config.hpp"
#include "alibi/layer_ops.hpp"
#include "alibi/layers/kv_cache.hpp"
#include "alibi/layers/multi_head_attention.hpp"
#include "alibi/layers/transformer_layer.hpp"
#include "alibi/mpi/agreement.hpp"
#include "alibi/mpi/comm.hpp"
#include "alibi/mpi/staging.hpp"

namespace alibi {
namespace detail {
namespace mpi {

template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "alibi::mpi tensor parallelism: float or double layers");
  return std::is_same<T, float>::value ? MPI_FLOAT : MPI_DOUBLE;
}

/// Whether a staged all-reduce of n elements fits one MPI message's count with its P flags
/// (allreduce_rows); where it does not, every rank refuses it before any collective.
inline bool flagged_allreduce_fits(index_t n, int P) {
  return n + P <= std::numeric_limits<int>::max();
}

/// A staged backend's all-reduce (allreduce_rows): the rows copied to `pack` in host memory,
/// P elements more, one per rank: 1 where that rank failed (its copy to the host, or its
/// forward before this all-reduce: join_failed_allreduce), summed with the partial sums, so
/// that every rank raises (and none waits in the next collective).
template <class T, class Backend>
void allreduce_staged_rows(MPI_Comm comm, const Backend& be, T* rows, index_t ld, index_t count,
                           index_t cols, std::vector<T>& pack) {
  const index_t n = count * cols;
  if (n == 0) return;
  using ops = ops_of<Backend>;
  const std::string fn = "alibi::mpi tensor parallelism (all-reduce staging)";
  const int P = comm_size(comm), rank = comm_rank(comm);
  if (!flagged_allreduce_fits(n, P))
    raise(
        argument_error("alibi::mpi: a tensor-parallel all-reduce of more than 2^31 - 1 "
                       "elements (one MPI message's count) with the ranks' flags"));
  pack.assign(static_cast<std::size_t>(n + P), T(0));
  std::string failure;
  guarded<Backend>(failure, fn, [&] {
    ops::stage_rows(be, static_cast<const T*>(rows), ld, pack.data(), cols, count, cols);
    ops::fence(be);  // the layer's queued work, then the copy, are done
  });
  pack[static_cast<std::size_t>(n + rank)] = failure.empty() ? T(0) : T(1);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n + P), mpi_type<T>(),
                          MPI_SUM, comm),
            "MPI_Allreduce (tensor-parallel partial sums)");
  if (!failure.empty()) raise(argument_error(failure));
  for (int r = 0; r < P; ++r)
    if (pack[static_cast<std::size_t>(n + r)] != T(0))
      raise(argument_error(fn + ": rank " + std::to_string(r) + " failed (its error says why)"));
  guarded<Backend>(failure, fn, [&] {
    ops::stage_rows(be, static_cast<const T*>(pack.data()), cols, rows, ld, count, cols);
    ops::fence(be);  // before `pack` is written again
  });
  all_succeeded(comm, fn, failure);
}

/// In place: rows (count, cols), row stride ld, in the backend's memory, summed over the
/// ranks of comm (MPI_Allreduce). Rows with gaps, and every staged backend's rows, go through
/// `pack` in host memory.
template <class T, class Backend>
void allreduce_rows(MPI_Comm comm, const Backend& be, T* rows, index_t ld, index_t count,
                    index_t cols, std::vector<T>& pack) {
  const index_t n = count * cols;
  if (n > std::numeric_limits<int>::max())
    raise(
        argument_error("alibi::mpi: a tensor-parallel all-reduce of more than 2^31 - 1 "
                       "elements (one MPI message's count)"));
  if constexpr (staged<Backend>) {
    allreduce_staged_rows(comm, be, rows, ld, count, cols, pack);
    return;
  }
  if (ld == cols || count <= 1) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, rows, static_cast<int>(n), mpi_type<T>(), MPI_SUM, comm),
              "MPI_Allreduce (tensor-parallel partial sums)");
    return;
  }
  pack.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < count; ++i)
    std::memcpy(pack.data() + i * cols, rows + i * ld, static_cast<std::size_t>(cols) * sizeof(T));
  check_mpi(
      MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n), mpi_type<T>(), MPI_SUM, comm),
      "MPI_Allreduce (tensor-parallel partial sums)");
  for (index_t i = 0; i < count; ++i)
    std::memcpy(rows + i * ld, pack.data() + i * cols, static_cast<std::size_t>(cols) * sizeof(T));
}

/// A rank that failed before an all-reduce of n elements that the other ranks wait in (staged
/// backends, allreduce_rows): its part of that all-reduce, zeros with this rank's failure
/// flag set, so that they raise there.
template <class T>
void join_failed_allreduce(MPI_Comm comm, index_t n, std::vector<T>& pack) {
  const int P = comm_size(comm), rank = comm_rank(comm);
  pack.assign(static_cast<std::size_t>(n + P), T(0));
  pack[static_cast<std::size_t>(n + rank)] = T(1);
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, pack.data(), static_cast<int>(n + P), mpi_type<T>(),
                          MPI_SUM, comm),
            "MPI_Allreduce (tensor-parallel partial sums)");
}

inline tensor_parallel_slice slice_of(MPI_Comm comm) { return {comm_rank(comm), comm_size(comm)}; }

/// This rank's own check of a tensor-parallel forward's tensors (what the module would
/// refuse, so that no rank refuses alone and leaves the others in the all-reduce): x and out
/// (batch, seq, embed_dim) with rows the layers accept, out of x's shape.
template <class T>
std::string tp_local_check(const tensor_view<const T, 3>& x, const tensor_view<T, 3>& out,
                           index_t E, const char* fn) {
  try {
    row_stride(fn, "x", x, E);
    row_stride(fn, "out", out, E);
    if (out.extents[0] != x.extents[0] || out.extents[1] != x.extents[1])
      return std::string(fn) + ": out must have the shape of x";
  } catch (const error& e) {
    return e.what();
  }
  return {};
}

/// Both tensor-parallel modules (tensor_parallel_layer, tensor_parallel_attention: Config
/// says which): the communicator and this rank's slice, the shard (Module<T, Backend>, built
/// from the full configuration after every rank agreed on it), the agreement of every
/// forward call and the all-reduce staging.
template <class T, class Backend, template <class, class> class Module, class Config>
class tensor_parallel_base {
 public:
  /// Every rank constructs it with the same full configuration: its shard, whose
  /// row-parallel output rank 0 adds the row-parallel biases (and the layer's residual) to.
  tensor_parallel_base(MPI_Comm comm, const Config& config, const Backend& backend = Backend{})
      : comm_(comm), backend_(backend), slice_(slice_of(comm)), fn_(module_name(config)) {
    agreement a;
    module_words(a, config, true);
    std::string local_error;
    try {
      shard_ = std::make_unique<Module<T, Backend>>(tensor_parallel_shard(config, slice_), backend);
    } catch (const std::exception& e) {  // alibi::error, or the backend's (cuda_error)
      local_error = fn_ + ": " + e.what();
    }
    a.check(comm_, fn_, local_error);
    if constexpr (out_reduced)
      shard_->set_output_bias(slice_.rank == 0);
    else
      shard_->set_partial_sums([this](T* rows, index_t ld, index_t count,
                                      index_t cols) { reduce(rows, ld, count, cols); },
                               slice_.rank == 0);
  }
  tensor_parallel_base(const tensor_parallel_base&) = delete;  // the shard's hook holds this
  tensor_parallel_base& operator=(const tensor_parallel_base&) = delete;

  /// This rank's part: {rank, ranks} of the communicator.
  const tensor_parallel_slice& slice() const { return slice_; }
  /// This rank's shard (its parameters are this rank's slices; set or load them there).
  Module<T, Backend>& shard() { return *shard_; }
  const Module<T, Backend>& shard() const { return *shard_; }

  /// The module's forward of x (batch, seq, embed_dim), the same on every rank -> out (same
  /// shape, on every rank).
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, const forward_options& opt = {}) {
    forward_call(x, out, opt, nullptr, [&] { shard_->forward(x, out, opt); });
  }
  /// Incremental decoding: each rank's cache holds its shard's kv heads.
  template <class S>
  void forward(tensor_view<const T, 3> x, tensor_view<T, 3> out, kv_cache<T, Backend, S>& cache,
               const forward_options& opt = {}) {
    // The caches' shapes and lengths are agreed on too: a cache one rank refuses (full, or
    // left different by a failed forward) would leave the others in the all-reduce.
    const std::vector<index_t>& lens = cache.lengths();
    const cache_words words{
        cache.batch(), cache.capacity(),
        view_hash(make_view<const index_t>(lens.data(), static_cast<index_t>(lens.size())),
                  static_cast<index_t>(lens.size()), 1),
        cache.kv_heads(), cache.head_dim()};
    forward_call(x, out, opt, &words, [&] { shard_->forward(x, out, cache, opt); });
  }

 protected:
  /// The attention module's shard leaves its output's all-reduce to forward (out_reduced);
  /// the Transformer layer's makes its two (attention, FFN) through its partial-sums hook.
  static constexpr bool out_reduced = std::is_same<Config, mha_config>::value;
  static constexpr int reductions_per_call = out_reduced ? 1 : 2;

  /// Before a forward: the ranks agree on the call (and each checks its own tensors).
  void agree_call(const tensor_view<const T, 3>& x, const tensor_view<T, 3>& out,
                  const forward_options& opt, const cache_words* cache) {
    agreement a;
    module_words(a, shard_->config(), false);
    add_forward_words(a, x, opt, cache);
    const std::string fn = fn_ + "::forward";
    a.check(comm_, fn, tp_local_check(x, out, embed_dim(shard_->config()), fn.c_str()));
  }
  void reduce(T* rows, index_t ld, index_t count, index_t cols) {
    ++reductions_;
    try {
      allreduce_rows(comm_, backend_, rows, ld, count, cols, pack_);
    } catch (...) {
      reduce_raised_ = true;  // every rank raised there
      throw;
    }
  }

  /// A forward call f of x (the shard's forward, then for the attention module its
  /// all-reduce), which makes `reductions` all-reduces of (batch * seq, embed_dim) elements. Staged
  /// backends: a failure on one rank (a CUDA error) is an error on every rank: the failing rank
  /// joins the next all-reduce the others wait in, flagged, and they raise there; one after the
  /// last all-reduce is reported by one MPI_Allgather at the end.
  template <class F>
  void run(const tensor_view<const T, 3>& x, int reductions, F&& f) {
    if constexpr (!staged<Backend>) {
      (void)x;
      (void)reductions;
      f();
    } else {
      const std::string fn = fn_ + "::forward";
      reductions_ = 0;
      reduce_raised_ = false;
      std::string failure;
      guarded<Backend>(failure, fn, [&] {
        f();
        ops_of<Backend>::fence(backend_);  // the work queued after the last all-reduce too
      });
      if (!failure.empty() && reduce_raised_) raise(argument_error(failure));
      // The others wait in the next all-reduce. Unless it has too many elements: then every
      // rank refuses it before any collective, and raises; or none: then it makes no
      // collective, and they reach all_succeeded.
      if (!failure.empty() && reductions_ < reductions) {
        const index_t n = x.extents[0] * x.extents[1] * embed_dim(shard_->config());
        if (!flagged_allreduce_fits(n, slice_.ranks)) raise(argument_error(failure));
        if (n > 0) {
          join_failed_allreduce<T>(comm_, n, pack_);
          raise(argument_error(failure));
        }
      }
      all_succeeded(comm_, fn, failure);
    }
  }

  /// One forward call: the ranks agree on it, then run the shard's forward
  /// (shard_forward) and, for the attention module, the all-reduce of out.
  template <class F>
  void forward_call(const tensor_view<const T, 3>& x, const tensor_view<T, 3>& out,
                    const forward_options& opt, const cache_words* cache, F&& shard_forward) {
    agree_call(x, out, opt, cache);
    run(x, reductions_per_call, [&] {
      shard_forward();
      if constexpr (out_reduced) {
        const index_t E = embed_dim(shard_->config());
        const index_t ld = alibi::detail::row_stride((fn_ + "::forward").c_str(), "out", out, E);
        reduce(out.data, ld, out.extents[0] * out.extents[1], E);
      }
    });
  }

  static void module_words(agreement& a, const layer_config& c, bool full) {
    add_module_words(a, c.attention, &c, full, reads_host_memory<Backend>);
  }
  static void module_words(agreement& a, const mha_config& c, bool full) {
    add_module_words(a, c, nullptr, full, reads_host_memory<Backend>);
  }
  static const char* module_name(const layer_config&) {
    return "alibi::mpi::tensor_parallel_layer";
  }
  static const char* module_name(const mha_config&) {
    return "alibi::mpi::tensor_parallel_attention";
  }
  static index_t embed_dim(const layer_config& c) { return c.attention.embed_dim; }
  static index_t embed_dim(const mha_config& c) { return c.embed_dim; }

  MPI_Comm comm_;
  Backend backend_;
  tensor_parallel_slice slice_;
  std::string fn_;
  std::unique_ptr<Module<T, Backend>> shard_;
  std::vector<T> pack_;  // all-reduce staging for strided rows
  int reductions_ = 0;   // the all-reduces of the forward call under way
  bool reduce_raised_ = false;
};

/// The bases of alibi::mpi::tensor_parallel_layer and tensor_parallel_attention.
template <class T, class Backend>
using tensor_parallel_layer_base =
    tensor_parallel_base<T, Backend, transformer_layer, layer_config>;
template <class T, class Backend>
using tensor_parallel_attention_base =
    tensor_parallel_base<T, Backend, multi_head_attention, mha_config>;

}  // namespace mpi
}  // namespace detail

namespace mpi {

/// A Transformer layer split over the ranks of `comm` (Megatron tensor parallelism; every
/// rank constructs it with the same full configuration and calls forward together, with the
/// same input): rank r holds tensor_parallel_shard(config, {r, P}), a transformer_layer with
/// q_heads / P heads (kv_heads / P kv heads, their global slopes) and ff_dim / P FFN
/// features. The q/k/v and the FFN's up (and gate) projections are column-parallel, the
/// output and down projections row-parallel: after each block one MPI_Allreduce of the
/// (rows, embed_dim) partial sums, to which rank 0 adds the residual and the two row-parallel
/// biases. Load a rank's part of a checkpoint with load_family_layer(layer.shard(), file,
/// family, i, layer.slice()) or set the shard's parameters. KV caches hold the shard's kv heads
/// (kv_cache<T, Backend>::for_module(layer.shard(), ...)): each rank caches 1 / P of them.
/// Host backends (backend::eigen, backend::reference), float or double, or backend::cuda,
/// float (x and out in device memory; each all-reduce copies the partial sums to the host
/// and back, synchronizing backend.stream); forward only.
///
/// Errors: heads or ff_dim that the ranks do not divide, ranks built with different
/// configurations, or forward calls that differ in shape, masks, lengths, key mask or cache
/// use, or tensors one rank refuses (one MPI_Allgather of a few words per call) are an
/// alibi::error on every rank. What each rank's KV cache holds is its own (build them alike).
template <class T, class Backend>
class tensor_parallel_layer : public detail::mpi::tensor_parallel_layer_base<T, Backend> {
 public:
  using detail::mpi::tensor_parallel_layer_base<T, Backend>::tensor_parallel_layer_base;
};

/// Multi-head attention split over the ranks of `comm` by heads (Megatron): rank r holds
/// tensor_parallel_shard(config, {r, P}) (q_heads / P heads, kv_heads / P kv heads, their
/// global slopes): its q/k/v projections are its heads' rows, its output projection's
/// weight its heads' columns; the (rows, embed_dim) outputs are summed with one
/// MPI_Allreduce, rank 0 adding out_proj.bias. Parameters: set the shard's (its
/// parameters() lists this rank's shapes). Same rules as tensor_parallel_layer.
template <class T, class Backend>
class tensor_parallel_attention : public detail::mpi::tensor_parallel_attention_base<T, Backend> {
 public:
  using detail::mpi::tensor_parallel_attention_base<T, Backend>::tensor_parallel_attention_base;
};

}  // namespace mpi
}  // namespace alibi
