// SPDX-License-Identifier: MIT
// alibi::backend::cuda: the attention front end's CUDA implementation. Picks the kernel
// instance (element type x head dim) at run time from a fixed list of compile-time
// configurations, decides the split-KV partition from the shapes alone, and queues the
// work on the caller's stream without synchronizing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "alibi/attention.hpp"
#include "alibi/backend/cuda/aux_kernels.cuh"
#include "alibi/backend/cuda/error.cuh"
#include "alibi/backend/cuda/kernel.cuh"
#include "alibi/backend/cuda/merge.cuh"

namespace alibi {
namespace cuda_detail {

/// 0, 1, 2 for the element types the kernels take: float, __half, __nv_bfloat16 (-1 for
/// any other).
template <class T>
inline constexpr int element_code = std::is_same<T, float>::value           ? 0
                                    : std::is_same<T, __half>::value        ? 1
                                    : std::is_same<T, __nv_bfloat16>::value ? 2
                                                                            : -1;
template <class T>
inline constexpr bool supported_element = element_code<T> >= 0;

/// The head dims the kernels are built for.
template <int... D>
struct head_dims {
  static constexpr int count = sizeof...(D);
  static constexpr int list[sizeof...(D)] = {D...};

  /// Calls f(std::integral_constant<int, d>{}) for the one listed d == dim; false if none.
  template <class F>
  static bool dispatch(index_t dim, F&& f) {
    return ((dim == D ? (f(std::integral_constant<int, D>{}), true) : false) || ...);
  }

  static constexpr bool contains(index_t dim) { return ((dim == D) || ...); }

  /// "32, 64, 96 or 128": the list for error messages.
  static std::string names() {
    std::string s;
    for (int i = 0; i < count; ++i)
      s += (i == 0 ? "" : i + 1 == count ? " or " : ", ") + std::to_string(list[i]);
    return s;
  }
};
/// The one list of head dims: the run-time dispatch, can_implement's check and (checked by a
/// static_assert below) the precompiled instances all follow it.
using kernel_head_dims = head_dims<32, 64, 96, 128>;

template <class F>
bool dispatch_head_dim(index_t d, F&& f) {
  return kernel_head_dims::dispatch(d, std::forward<F>(f));
}

/// Multiprocessor count of the current device (a cheap host-side query: no cache, whose
/// unsynchronized writes would race between host threads).
inline int multiprocessors() {
  int dev = 0, n = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return n;
}

/// The stream-ordered memory pool of the split-KV workspace on `device`: alibi's own pool,
/// which keeps freed memory (release threshold: never), so that the workspace of each
/// decoding step is a reuse rather than an allocation from the driver. The caller's default
/// pool is left untouched. One pool per device, created on first use.
inline cudaMemPool_t workspace_pool(int device) {
  static std::mutex mutex;
  static cudaMemPool_t pools[64] = {};
  if (device < 0 || device >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (!pools[device]) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    check(cudaMemPoolCreate(&pools[device], &props), "cudaMemPoolCreate (split-KV workspace)");
    std::uint64_t keep = ~std::uint64_t(0);
    check(cudaMemPoolSetAttribute(pools[device], cudaMemPoolAttrReleaseThreshold, &keep),
          "cudaMemPoolSetAttribute");
  }
  return pools[device];
}

template <class T, int R>
bool rows_aligned(const tensor_view<T, R>& v) {
  if (reinterpret_cast<std::uintptr_t>(v.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < R; ++d)
    if (v.extents[d] > 1 && (v.strides[d] * static_cast<index_t>(sizeof(T))) % 16 != 0)
      return false;
  return true;
}

/// Whether a pointer is one the device cannot read: memory the CUDA runtime knows as
/// unregistered host memory (pageable malloc/new/stack). Pinned, managed and device memory
/// pass; so does anything the runtime cannot classify (the kernel then reports the fault).
inline bool host_only_pointer(const void* ptr) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error the query may leave
    return false;
  }
  return attr.type == cudaMemoryTypeUnregistered;
}

/// A pointer a CUDA call reads or writes, with the argument's name.
struct named_pointer {
  const char* name;
  const void* ptr;
};

/// Refuses the first of `views` in pageable host memory, which the kernels would fault on.
template <std::size_t N>
status check_device_pointers(const std::string& f, const named_pointer (&views)[N]) {
  for (const named_pointer& v : views)
    if (host_only_pointer(v.ptr))
      return status::failure(f + ": " + v.name +
                             ".data points to host memory; the CUDA backend reads device "
                             "memory (cudaMalloc, cudaMallocManaged or pinned host memory)");
  return {};
}

/// Refuses tensors and per-batch views in host memory that the kernels would fault on.
template <class TQ, class TKV, class TO, class Isa>
status check_device_pointers(const std::string& f, const attention_problem& p,
                             const detail::attention_tensors<TQ, TKV, TO, Isa>& t) {
  const named_pointer views[] = {{"q", t.q.data},
                                 {"k", t.k.data},
                                 {"v", t.v.data},
                                 {"out", t.out.data},
                                 {"params.q_lengths", p.q_lengths.data},
                                 {"params.k_lengths", p.k_lengths.data},
                                 {"params.q_offsets", p.q_offsets.data},
                                 {"params.k_offsets", p.k_offsets.data},
                                 {"params.key_mask", p.key_mask.data},
                                 {"params.logsumexp", p.lse.data},
                                 {"params.slopes.values", p.slopes.values.data},
                                 {"params.key_norm_bounds", p.key_norm_bounds.data}};
  return check_device_pointers(f, views);
}

/// The kernel partition of a problem: row tiles, and the key chunks of the split-KV path.
struct partition {
  index_t row_tiles = 0, splits = 1, chunk = 0, blocks = 0;
};

template <class Tr>
partition make_partition(const attention_problem& p, index_t slots) {
  partition pt;
  const index_t bm = Tr::block_m, bn = Tr::block_n;
  pt.row_tiles = (p.q_len * p.group_size() + bm - 1) / bm;
  const index_t items = pt.row_tiles * p.batch * p.kv_heads;
  pt.chunk = (p.k_len + bn - 1) / bn * bn;
  // Split the keys when the row tiles alone leave resident-block slots of the device empty
  // (decoding: few query rows, a long cache): as many chunks as fill the slots in one
  // wave, each of at least 4 tiles. The partition depends on the shapes and the device's
  // slot count only.
  constexpr index_t min_chunk_tiles = 4;
  const index_t k_tiles = pt.chunk / bn;
  if (items > 0 && 2 * items <= slots && k_tiles >= 2 * min_chunk_tiles) {
    index_t splits = slots / items;
    const index_t max_splits = k_tiles / min_chunk_tiles;
    splits = splits < max_splits ? splits : max_splits;
    if (splits > 1) {
      pt.chunk = (k_tiles + splits - 1) / splits * bn;
      pt.splits = (p.k_len + pt.chunk - 1) / pt.chunk;
    }
  }
  pt.blocks = items * pt.splits;
  return pt;
}

template <class Tr, class T = typename Tr::element>
void launch_instance(const attention_problem& p, tensor_view<const T, 4> q,
                     tensor_view<const T, 4> k, tensor_view<const T, 4> v, tensor_view<T, 4> out,
                     cudaStream_t stream) {
  fwd_args<T> a;
  a.p = p;
  a.p.stats = nullptr;  // host memory: never passed to the device
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.aligned = rows_aligned(q) && rows_aligned(k) && rows_aligned(v);
  // Set on every call (a cheap host call): the attribute is per device, and the caller may
  // switch devices between calls.
  check(cudaFuncSetAttribute(attention_kernel<Tr>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(Tr::smem_bytes)),
        "cudaFuncSetAttribute(max dynamic shared memory)");
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, attention_kernel<Tr>, Tr::threads,
                                                      Tr::smem_bytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const partition pt =
      make_partition<Tr>(p, static_cast<index_t>(per_sm > 0 ? per_sm : 1) * multiprocessors());
  a.row_tiles = pt.row_tiles;
  a.splits = pt.splits;
  a.chunk = pt.chunk;
  if (pt.blocks == 0) return;

  // One workspace from alibi's pool: the stats counters (params.stats), the split-KV
  // partial results, and far-tile skipping's key-norm prefix and suffix maxima.
  const index_t rows = p.batch * p.q_heads * p.q_len;
  const index_t split_floats = pt.splits > 1 ? pt.splits * rows * (p.head_dim + 1) : 0;
  a.norm_grid = Tr::skip ? (p.k_len + key_norm_block - 1) / key_norm_block : 0;
  const index_t norm_floats = 2 * p.batch * p.kv_heads * a.norm_grid;
  const std::size_t counter_bytes = p.stats ? 2 * sizeof(unsigned long long) : 0;
  const std::size_t bytes =
      counter_bytes + sizeof(float) * static_cast<std::size_t>(split_floats + norm_floats);
  void* workspace = nullptr;
  if (bytes > 0) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    cudaMemPool_t pool = workspace_pool(device);
    check(pool ? cudaMallocFromPoolAsync(&workspace, bytes, pool, stream)
               : cudaMallocAsync(&workspace, bytes, stream),
          "cudaMallocAsync (attention workspace)");
  }
  float* floats = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + counter_bytes);
  if (pt.splits > 1) {
    a.part_o = floats;
    a.part_lse = a.part_o + pt.splits * rows * p.head_dim;
  }
  cudaError_t launched = cudaSuccess;
  auto queued = [&](cudaError_t e) {
    if (launched == cudaSuccess) launched = e;
  };
  if (p.stats) {
    a.counters = static_cast<unsigned long long*>(workspace);
    queued(cudaMemsetAsync(a.counters, 0, counter_bytes, stream));
  }
  if constexpr (Tr::skip) {
    float* prefix = floats + split_floats;
    float* suffix = prefix + p.batch * p.kv_heads * a.norm_grid;
    a.norm_prefix = prefix;
    a.norm_suffix = suffix;
    const bool caller = p.key_norm_bounds.data != nullptr;
    if (!caller) {
      key_norm_args<T> na;
      na.p = a.p;
      na.k = k;
      na.out = make_view(suffix, p.batch, p.kv_heads, a.norm_grid);
      na.grid = a.norm_grid;
      na.aligned = rows_aligned(k);
      const index_t warps = p.batch * p.kv_heads * a.norm_grid;
      key_norm_kernel<T, Tr::head_dim>
          <<<static_cast<unsigned>((warps + 3) / 4), 128, 0, stream>>>(na);
      queued(cudaGetLastError());
    }
    norm_scan_kernel<T><<<static_cast<unsigned>((p.batch * p.kv_heads + 3) / 4), 128, 0, stream>>>(
        a, prefix, suffix, caller);
    queued(cudaGetLastError());
  }
  if (launched == cudaSuccess) {
    attention_kernel<Tr>
        <<<static_cast<unsigned>(pt.blocks), Tr::threads, Tr::smem_bytes, stream>>>(a);
    queued(cudaGetLastError());
  }
  if (launched == cudaSuccess && pt.splits > 1) {
    merge_kernel<T, Tr::head_dim><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(a);
    queued(cudaGetLastError());
  }
  unsigned long long counts[2] = {0, 0};
  if (a.counters && launched == cudaSuccess)
    queued(cudaMemcpyAsync(counts, a.counters, counter_bytes, cudaMemcpyDeviceToHost, stream));
  if (workspace) queued(cudaFreeAsync(workspace, stream));
  // params.stats: the counters reach the host only when the call has finished, so a call
  // that asks for them waits for its stream.
  if (p.stats && launched == cudaSuccess) queued(cudaStreamSynchronize(stream));
  check(launched, "attention kernel launch");
  if (p.stats) {
    p.stats->tiles_computed += static_cast<std::int64_t>(counts[0]);
    p.stats->tiles_skipped += static_cast<std::int64_t>(counts[1]);
  }
}

/// The problem as the kernels see it: far-tile skipping only where the backend opts in
/// (backend::cuda::far_tile_skipping, k_len >= skip_min_keys).
inline attention_problem gate_skipping(const backend::cuda& be, attention_problem p) {
  p.skip_far_tiles = p.skip_far_tiles && be.far_tile_skipping && p.k_len >= be.skip_min_keys;
  return p;
}

/// Picks the kernel instance: the decoding one when every row of a (batch, kv head) fits
/// one 16-row tile (q_len x group <= 16) and tensor cores are used, the general one else;
/// each with far-tile skipping (params.skip_far_tiles, ALiBi on, k_len > key_norm_block)
/// or without.
/// The internal entry point: `p` is a checked problem (detail::prepare) with head_dim D.
/// `Tuning` (a kernel_tuning) names the kernel configuration; the library's backend uses
/// the default, the GPU benchmark may pass others to compare them.
template <class T, int D, class Tuning = kernel_tuning<>, class F>
void with_instance(const attention_problem& p, F&& f) {
  // Far-tile skipping as on the CPU, over blocks of key norms.
  const bool skip = p.skips_far_tiles((p.k_len + key_norm_block - 1) / key_norm_block);
  auto pick = [&](auto decode) {
    constexpr bool Decode = decltype(decode)::value;
    if (skip)
      f(kernel_traits<T, D, Decode, Tuning, true>{});
    else
      f(kernel_traits<T, D, Decode, Tuning, false>{});
  };
  if constexpr (!std::is_same<T, float>::value) {
    if (p.q_len * p.group_size() <= 16) {
      pick(std::true_type{});
      return;
    }
  }
  pick(std::false_type{});
}

template <class T, int D, class Tuning = kernel_tuning<>>
void launch(const attention_problem& p, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
            tensor_view<const T, 4> v, tensor_view<T, 4> out, cudaStream_t stream) {
  with_instance<T, D, Tuning>(
      p, [&](auto traits) { launch_instance<decltype(traits)>(p, q, k, v, out, stream); });
}

/// Refuses a call whose kernel instance needs more dynamic shared memory per block than the
/// current device allows (sm_86/sm_89 GPUs allow 99 KiB; head_dim 128 needs more): a clear
/// status instead of cudaFuncSetAttribute's "invalid argument" at launch. A device that
/// cannot be queried is left to the launch to report.
template <class T>
status check_shared_memory(const std::string& f, const attention_problem& p) {
  std::size_t need = 0;
  dispatch_head_dim(p.head_dim, [&](auto dim) {
    with_instance<T, decltype(dim)::value>(
        p, [&](auto traits) { need = decltype(traits)::smem_bytes; });
  });
  int device = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    cudaGetLastError();  // the query's own error, not the call's
    return {};
  }
  if (need > static_cast<std::size_t>(limit))
    return status::failure(f + ": this call's kernel (head_dim " + detail::str(p.head_dim) +
                           ") needs " + std::to_string(need) +
                           " bytes of shared memory per block; the current device allows " +
                           std::to_string(limit) +
                           " (sm_80, sm_90 and newer data-center GPUs "
                           "allow 163 KiB or more)");
  return {};
}

/// The library's kernel instances, launch<T, D> with the default tuning for every element type
/// and head dim of kernel_head_dims: one list for their explicit instantiation
/// (src/cuda_kernels.cu) and its declaration below.
// clang-format off
#define ALIBI_CUDA_KERNEL_INSTANCES(X)                                                         \
  X(float, 32)          X(float, 64)          X(float, 96)          X(float, 128)          \
  X(__half, 32)         X(__half, 64)         X(__half, 96)         X(__half, 128)         \
  X(__nv_bfloat16, 32)  X(__nv_bfloat16, 64)  X(__nv_bfloat16, 96)  X(__nv_bfloat16, 128)
// clang-format on

#define ALIBI_CUDA_INSTANCE_ENTRY(T, D) {element_code<T>, D},
struct kernel_instance {
  int type, dim;
};
inline constexpr kernel_instance kernel_instances[] = {
    ALIBI_CUDA_KERNEL_INSTANCES(ALIBI_CUDA_INSTANCE_ENTRY)};
#undef ALIBI_CUDA_INSTANCE_ENTRY

/// Whether the instance list holds exactly every (element type, head dim of
/// kernel_head_dims) pair, in that order.
constexpr bool instances_cover_head_dims() {
  constexpr int n = kernel_head_dims::count;
  if (sizeof(kernel_instances) / sizeof(kernel_instance) != std::size_t(3 * n)) return false;
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < n; ++i)
      if (kernel_instances[t * n + i].type != t ||
          kernel_instances[t * n + i].dim != kernel_head_dims::list[i])
        return false;
  return true;
}
static_assert(instances_cover_head_dims(),
              "ALIBI_CUDA_KERNEL_INSTANCES must list every element type with every head dim of "
              "kernel_head_dims");

#define ALIBI_CUDA_LAUNCH_SIGNATURE(T, D)                                               \
  void launch<T, D, kernel_tuning<>>(const attention_problem&, tensor_view<const T, 4>, \
                                     tensor_view<const T, 4>, tensor_view<const T, 4>,  \
                                     tensor_view<T, 4>, cudaStream_t)

// With ALIBI_CUDA_PRECOMPILED_KERNELS (alibi's own CUDA tests and benchmarks, linked with
// src/cuda_kernels.cu) the kernels are declared, not instantiated: nvcc compiles each
// instance's device code once for the whole build instead of once per file, for every
// architecture.
#if defined(ALIBI_CUDA_PRECOMPILED_KERNELS)
#define ALIBI_CUDA_DECLARE_LAUNCH(T, D) extern template ALIBI_CUDA_LAUNCH_SIGNATURE(T, D);
ALIBI_CUDA_KERNEL_INSTANCES(ALIBI_CUDA_DECLARE_LAUNCH)
#undef ALIBI_CUDA_DECLARE_LAUNCH
#endif

}  // namespace cuda_detail

/// Upper bounds on the Euclidean norms of the keys of k (batch, kv_heads, k_len, head_dim;
/// float, __half or __nv_bfloat16 in device memory), one per block of key_norm_block keys,
/// into bounds (batch, kv_heads, ceil(k_len / key_norm_block); device memory): what
/// attention_params::key_norm_bounds takes, so that a caller who keeps K across calls (a KV
/// cache) keeps these beside it and a decode step with far-tile skipping reads only the K/V
/// tiles it computes. Only the blocks from the one holding first_key on are computed (each
/// from all of its keys below k_len); the others are left as they are, so a cache that
/// appends keys at position n refreshes its bounds with first_key = n. Computed by the same
/// kernel and arithmetic as the bounds the CUDA backend forms itself (the same bits when
/// every key is valid); a NaN key gives NaN. Queued on be.stream without synchronizing.
template <class T>
void key_norm_bounds(const backend::cuda& be, const tensor_view<const T, 4>& k,
                     const tensor_view<float, 3>& bounds, index_t first_key = 0) {
  static_assert(cuda_detail::supported_element<T>,
                "alibi::key_norm_bounds (cuda): k must be float, __half or __nv_bfloat16");
  const std::string f = "alibi::key_norm_bounds (cuda)";
  detail::check_key_norm_bounds_args(f, k, bounds, first_key);
  const index_t B = k.extents[0], H = k.extents[1], L = k.extents[2], D = k.extents[3];
  const index_t blocks = (L + key_norm_block - 1) / key_norm_block;
  if (!cuda_detail::kernel_head_dims::contains(D))
    detail::raise(argument_error(f + ": head_dim (k.extent(3)) must be " +
                                 cuda_detail::kernel_head_dims::names() + ", got " +
                                 detail::str(D)));
  if (B == 0 || H == 0 || L == 0 || first_key / key_norm_block >= blocks) return;
  if (k.data == nullptr || bounds.data == nullptr)
    detail::raise(argument_error(f + ": k.data and bounds.data must not be null"));
  if (cuda_detail::host_only_pointer(k.data) || cuda_detail::host_only_pointer(bounds.data))
    detail::raise(argument_error(f + ": k.data and bounds.data must be device memory"));
  cuda_detail::key_norm_args<T> na;
  na.p.batch = B;
  na.p.kv_heads = H;
  na.p.k_len = L;
  na.k = k;
  na.out = bounds;
  na.grid = blocks;
  na.t_first = first_key / key_norm_block;
  na.aligned = cuda_detail::rows_aligned(k);
  na.all_keys = true;
  const index_t warps = B * H * (blocks - na.t_first);
  cuda_detail::dispatch_head_dim(D, [&](auto dim) {
    cuda_detail::key_norm_kernel<T, decltype(dim)::value>
        <<<static_cast<unsigned>((warps + 3) / 4), 128, 0, be.stream>>>(na);
  });
  cuda_detail::check(cudaGetLastError(), "key_norm_kernel launch");
}

namespace detail {

template <>
struct attention_impl<backend::cuda> {
  template <class TQ, class TKV, class TO, class Isa>
  static status can_implement(const backend::cuda& be, const attention_problem& p,
                              const attention_tensors<TQ, TKV, TO, Isa>& t) {
    const std::string f = "alibi::attention (cuda)";
    if (!cuda_detail::supported_element<TQ> || !std::is_same<TQ, TKV>::value)
      return status::failure(f +
                             ": q, k and v must all be float, all __half or all "
                             "__nv_bfloat16");
    if (!std::is_same<TQ, TO>::value)
      return status::failure(f + ": out must have the element type of q, k and v");
    if (status s = cuda_detail::check_device_pointers(f, p, t); !s) return s;
    if (!cuda_detail::kernel_head_dims::contains(p.head_dim))
      return status::failure(f + ": head_dim (q.extent(3)) must be " +
                             cuda_detail::kernel_head_dims::names() + ", got " + str(p.head_dim));
    if (p.v_head_dim != p.head_dim)
      return status::failure(f + ": v_head_dim (v.extent(3)) must equal head_dim = " +
                             str(p.head_dim) + ", got " + str(p.v_head_dim));
    // Distances are formed in 32-bit floats per tile; keys below 2^28 keep them exact
    // (see detail::make_tile_frame), and the block count must fit a grid dimension.
    if (p.k_len >= (index_t(1) << 28))
      return status::failure(f + ": k_len must be below 2^28, got " + str(p.k_len));
    const index_t rows = p.q_len * p.group_size();
    if (rows >= (index_t(1) << 40) ||
        p.batch * p.kv_heads * ((rows + 63) / 64) * 128 >= (index_t(1) << 31))
      return status::failure(f +
                             ": batch * kv_heads * ceil(q_len * group / 64) must be below 2^24");
    if constexpr (cuda_detail::supported_element<TQ>)
      return cuda_detail::check_shared_memory<TQ>(f, cuda_detail::gate_skipping(be, p));
    return {};
  }

  template <class TQ, class TKV, class TO, class Isa>
  static void run(const backend::cuda& be, const attention_problem& p,
                  const attention_tensors<TQ, TKV, TO, Isa>& t) {
    if constexpr (cuda_detail::supported_element<TQ> && std::is_same<TQ, TKV>::value &&
                  std::is_same<TQ, TO>::value) {
      if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0) return;
      const attention_problem gp = cuda_detail::gate_skipping(be, p);
      cuda_detail::dispatch_head_dim(p.head_dim, [&](auto dim) {
        cuda_detail::launch<TQ, decltype(dim)::value>(gp, t.q, t.k, t.v, t.out, be.stream);
      });
    }
  }

  template <class T>
  static void merge(const backend::cuda& be, const partial_merge_args<T>& a) {
    const cuda_detail::named_pointer views[] = {{"out_a", a.out_a.data}, {"lse_a", a.lse_a.data},
                                                {"out_b", a.out_b.data}, {"lse_b", a.lse_b.data},
                                                {"out", a.out.data},     {"lse", a.lse.data}};
    cuda_detail::check_device_pointers("alibi::merge_partials (cuda)", views).throw_if_failed();
    cuda_detail::launch_partial_merge(a, be.stream);
  }
};

}  // namespace detail
}  // namespace alibi
