// SPDX-License-Identifier: MIT
// GPU benchmarks of the CUDA backend (Google Benchmark, times from CUDA events): prefill
// attention in bfloat16/half/float for D = 64 and 128, causal and not, L = 1024..32768 at
// batch x heads = 32, far-tile skipping off and on (counter `skipped`: the fraction of key
// tiles skipped); decoding (q_len 1, k_len 32768 and 131072) with MHA and GQA, skipping off
// and on; and, measured in
// the same process as ceilings, a cuBLAS bfloat16 GEMM and a device-to-device copy.
// Counters: TFLOP/s (attention flops as usually counted, halved for causal) and, for the
// decode and copy cases, GB/s of the bytes that must move. Also the Transformer layer (B = 1,
// embed 1024, 16 heads, ff 4096) forward and one decoding step, with the time split into
// projections / attention / FFN / norms from one synchronized run (layer_timings).
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <alibi/cuda.cuh>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>
#include "cuda_timing.cuh"

// The kernel configuration the attention benchmarks use. By default the library's own
// (alibi::attention). scripts/gpu-check.sh (ALIBI_EXPLORE=1) builds variants of this file
// with -DALIBI_BENCH_TUNING=<the kernel_tuning arguments>, e.g. -DALIBI_BENCH_TUNING=4,1,2
// (Warps, MTiles, MinBlocks[, BlockNWide[, QRegsLimit]]): the macro only chooses the
// explicit kernel_tuning passed to the internal entry point cuda_detail::launch; no library
// type depends on it.
#ifdef ALIBI_BENCH_TUNING
using bench_tuning = alibi::cuda_detail::kernel_tuning<ALIBI_BENCH_TUNING>;
#else
using bench_tuning = alibi::cuda_detail::kernel_tuning<>;
#endif

namespace {

using alibi::index_t;
using alibi_bench::ok;
using alibi_bench::time_cuda;

/// alibi::attention with the library's configuration; with another bench_tuning, the same
/// argument check (detail::prepare) and the internal entry point with that tuning.
template <class T>
void run_attention(const alibi::backend::cuda& be, alibi::tensor_view<const T, 4> q,
                   alibi::tensor_view<const T, 4> k, alibi::tensor_view<const T, 4> v,
                   alibi::tensor_view<T, 4> out, const alibi::attention_params& params) {
  if (std::is_same<bench_tuning, alibi::cuda_detail::kernel_tuning<>>::value) {
    alibi::attention(be, q, k, v, out, params);
    return;
  }
  alibi::detail::attention_problem prob;
  alibi::detail::attention_tensors<T, T, T> t;
  alibi::detail::prepare(be, q, k, v, out, params, prob, t).throw_if_failed();
  prob = alibi::cuda_detail::gate_skipping(be, prob);
  alibi::cuda_detail::dispatch_head_dim(prob.head_dim, [&](auto dim) {
    alibi::cuda_detail::launch<T, decltype(dim)::value, bench_tuning>(prob, t.q, t.k, t.v, t.out,
                                                                      be.stream);
  });
}

/// Deterministic pseudo-random normal-ish values (sum of uniforms), filled on the device.
template <class T>
__global__ void fill_random(T* x, index_t n, unsigned seed) {
  for (index_t i = blockIdx.x * static_cast<index_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<index_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    float s = 0;
    for (int r = 0; r < 4; ++r) {
      h ^= h >> 13;
      h *= 0x5bd1e995u;
      h ^= h >> 15;
      s += static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f;
    }
    x[i] = alibi::cuda_detail::elem<T>::from_float(s * 1.7f);
  }
}

template <class T>
struct device_tensor {
  T* ptr = nullptr;
  index_t n = 0;
  explicit device_tensor(index_t count, unsigned seed = 1) : n(count) {
    ok(cudaMalloc(&ptr, sizeof(T) * static_cast<std::size_t>(n)));
    fill_random<T><<<1024, 256>>>(ptr, n, seed);
    ok(cudaGetLastError());
  }
  ~device_tensor() { cudaFree(ptr); }
};

/// The backend for a benchmark's `skip` argument: far-tile skipping engaged at every length
/// (it is opt-in on the CUDA backend), or not.
alibi::backend::cuda bench_backend(bool skip) {
  alibi::backend::cuda be{};
  be.far_tile_skipping = skip;
  be.skip_min_keys = 0;
  return be;
}

/// The fraction of key tiles far-tile skipping skipped in one more (synchronizing) call with
/// params.stats, outside the timed calls.
template <class Run>
double skipped_fraction(alibi::attention_params& params, Run&& run) {
  alibi::attention_stats stats;
  params.stats = &stats;
  run();
  params.stats = nullptr;
  const double total = static_cast<double>(stats.tiles_computed + stats.tiles_skipped);
  return total > 0 ? static_cast<double>(stats.tiles_skipped) / total : 0.0;
}

// Args: D, L, causal, skip (far-tile skipping on or off).
template <class T>
void BM_cuda_attention(benchmark::State& state) {
  const index_t D = state.range(0), L = state.range(1);
  const bool causal = state.range(2) != 0;
  const index_t B = 2, H = 16;
  device_tensor<T> q(B * H * L * D, 1), k(B * H * L * D, 2), v(B * H * L * D, 3),
      out(B * H * L * D, 4);
  alibi::attention_params params;
  params.mask.causal = causal;
  params.skip_far_tiles = state.range(3) != 0;
  const alibi::backend::cuda be = bench_backend(params.skip_far_tiles);
  auto view = [&](T* p) { return alibi::make_view(p, B, H, L, D); };
  auto run = [&] {
    run_attention<T>(be, alibi::tensor_view<const T, 4>(view(q.ptr)),
                     alibi::tensor_view<const T, 4>(view(k.ptr)),
                     alibi::tensor_view<const T, 4>(view(v.ptr)), view(out.ptr), params);
  };
  time_cuda(state, run);
  // Dense flops (what the work would be without skipping), halved for causal.
  const double flops = 4.0 * B * H * static_cast<double>(L) * L * D * (causal ? 0.5 : 1.0);
  state.counters["TFLOPs"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["skipped"] = skipped_fraction(params, run);
}

/// One decoding step: q_len 1 against a long cache; GB/s of the K and V bytes a dense step
/// reads. Args: Hkv, Lk, skip: 0 off, 1 on (the call computes the key-norm bounds: a pass
/// over K), 2 on with the caller's bounds (alibi::key_norm_bounds, once, outside the timed
/// calls, as a KV cache keeps them).
template <class T>
void BM_cuda_decode(benchmark::State& state) {
  const index_t Hkv = state.range(0), Hq = 32, D = 128, Lk = state.range(1), B = 1;
  device_tensor<T> q(B * Hq * D, 1), k(B * Hkv * Lk * D, 2), v(B * Hkv * Lk * D, 3),
      out(B * Hq * D, 4);
  alibi::attention_params params;
  params.mask.causal = true;
  params.skip_far_tiles = state.range(2) != 0;
  const alibi::backend::cuda be = bench_backend(params.skip_far_tiles);
  const index_t blocks = (Lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
  device_tensor<float> bounds(B * Hkv * blocks, 9);
  if (state.range(2) == 2) {
    const auto bv = alibi::make_view(bounds.ptr, B, Hkv, blocks);
    alibi::key_norm_bounds(alibi::backend::cuda{}, alibi::make_view<const T>(k.ptr, B, Hkv, Lk, D),
                           bv);
    params.key_norm_bounds = bv;
  }
  auto run = [&] {
    run_attention<T>(be, alibi::make_view<const T>(q.ptr, B, Hq, 1, D),
                     alibi::make_view<const T>(k.ptr, B, Hkv, Lk, D),
                     alibi::make_view<const T>(v.ptr, B, Hkv, Lk, D),
                     alibi::make_view(out.ptr, B, Hq, 1, D), params);
  };
  time_cuda(state, run);
  const double bytes = 2.0 * B * Hkv * Lk * D * sizeof(T);
  state.counters["GBs"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["skipped"] = skipped_fraction(params, run);
}

/// The bandwidth ceiling: a 4 GiB device-to-device copy (bytes read + written).
void BM_copy_ceiling(benchmark::State& state) {
  const std::size_t n = std::size_t(1) << 31;
  void *a, *b;
  ok(cudaMalloc(&a, n));
  ok(cudaMalloc(&b, n));
  ok(cudaMemset(a, 1, n));
  time_cuda(state, [&] { ok(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice)); });
  state.counters["GBs"] =
      benchmark::Counter(2.0 * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(a);
  cudaFree(b);
}

/// The matrix ceiling: an 8192^3 bfloat16 GEMM with fp32 accumulation through cuBLAS.
void BM_cublas_bf16_gemm(benchmark::State& state) {
  const int n = 8192;
  device_tensor<__nv_bfloat16> a(index_t(n) * n, 5), b(index_t(n) * n, 6), c(index_t(n) * n, 7);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    state.SkipWithError("cublasCreate failed");
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  time_cuda(state, [&] {
    cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.ptr, CUDA_R_16BF, n, b.ptr,
                 CUDA_R_16BF, n, &beta, c.ptr, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  });
  state.counters["TFLOPs"] = benchmark::Counter(2.0 * n * n * static_cast<double>(n) * 1e-12,
                                                benchmark::Counter::kIsIterationInvariantRate);
  cublasDestroy(handle);
}

/// A Transformer layer of the CPU layer benchmark's shape, random weights (host-generated).
template <class T>
alibi::transformer_layer<T, alibi::backend::cuda> make_layer() {
  alibi::layer_config c;
  c.attention.embed_dim = 1024;
  c.attention.q_heads = 16;
  c.ff_dim = 4096;
  alibi::transformer_layer<T, alibi::backend::cuda> layer(c, alibi::backend::cuda{});
  unsigned h = 12345;
  for (const auto& p : layer.parameters()) {
    if (p.name.rfind("norm", 0) == 0) continue;
    index_t n = 1;
    for (index_t e : p.shape) n *= e;
    std::vector<float> w(static_cast<std::size_t>(n));
    for (float& x : w) {
      h = h * 1664525u + 1013904223u;
      x = (static_cast<float>(h >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    layer.set(p.name, w.data(), p.shape);
  }
  return layer;
}

void layer_counters(benchmark::State& state, const alibi::layer_timings& t) {
  const double total = t.projections + t.attention + t.ffn + t.norms;
  state.counters["proj_ms"] = 1e3 * t.projections;
  state.counters["attn_ms"] = 1e3 * t.attention;
  state.counters["ffn_ms"] = 1e3 * t.ffn;
  state.counters["norm_ms"] = 1e3 * t.norms;
  state.counters["attn_share"] = t.attention / total;
}

// Args: L, causal.
template <class T>
void BM_cuda_layer(benchmark::State& state) {
  const index_t L = state.range(0), E = 1024;
  auto layer = make_layer<T>();
  device_tensor<T> x(L * E, 5), y(L * E, 6);
  alibi::forward_options opt;
  opt.mask.causal = state.range(1) != 0;
  auto xv = alibi::make_view<const T>(x.ptr, 1, L, E);
  auto yv = alibi::make_view(y.ptr, 1, L, E);
  time_cuda(state, [&] { layer.forward(xv, yv, opt); });
  alibi::layer_timings t;
  opt.timings = &t;
  layer.forward(xv, yv, opt);
  layer_counters(state, t);
  const double flops =
      8.0 * L * E * E + 4.0 * L * E * 4096 + 4.0 * L * L * E * (opt.mask.causal ? 0.5 : 1.0);
  state.counters["TFLOPs"] =
      benchmark::Counter(flops / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: tokens in the cache. One decoding step (timed), then the cache is truncated back.
template <class T>
void BM_cuda_layer_decode(benchmark::State& state) {
  const index_t N = state.range(0), E = 1024;
  auto layer = make_layer<T>();
  auto cache = alibi::kv_cache<T, alibi::backend::cuda>::for_module(layer, 1, N + 1);
  device_tensor<T> prompt(N * E, 7), x(E, 8), y(E, 9);
  alibi::forward_options opt;
  opt.mask.causal = true;
  layer.forward(alibi::make_view<const T>(prompt.ptr, 1, N, E),
                alibi::make_view(prompt.ptr, 1, N, E), cache, opt);
  auto xv = alibi::make_view<const T>(x.ptr, 1, 1, E);
  auto yv = alibi::make_view(y.ptr, 1, 1, E);
  time_cuda(state, [&] {
    layer.forward(xv, yv, cache, opt);
    cache.truncate(0, N);
  });
  alibi::layer_timings t;
  opt.timings = &t;
  layer.forward(xv, yv, cache, opt);
  cache.truncate(0, N);
  layer_counters(state, t);
  const double bytes = sizeof(T) * (4.0 * E * E + 2.0 * E * 4096 + 2.0 * N * E);
  state.counters["GBs"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void prefill_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"D", "L", "causal", "skip"});
  for (int d : {64, 128})
    for (int causal : {1, 0})
      for (int l : {1024, 2048, 4096, 8192, 16384, 32768})
        for (int skip : {0, 1}) b->Args({d, l, causal, skip});
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void decode_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"Hkv", "Lk", "skip"});
  for (int skip : {0, 1, 2})
    b->Args({32, 32768, skip})->Args({8, 32768, skip})->Args({32, 131072, skip});
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_copy_ceiling)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_cublas_bf16_gemm)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_attention, __nv_bfloat16)->Apply(prefill_args);
BENCHMARK_TEMPLATE(BM_cuda_attention, __half)->Apply(prefill_args);
BENCHMARK_TEMPLATE(BM_cuda_attention, float)
    ->ArgNames({"D", "L", "causal", "skip"})
    ->Args({64, 4096, 1, 0})
    ->Args({128, 4096, 1, 0})
    ->Args({128, 4096, 0, 0})
    ->Args({128, 4096, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_cuda_decode, __nv_bfloat16)->Apply(decode_args);
BENCHMARK_TEMPLATE(BM_cuda_decode, __half)
    ->ArgNames({"Hkv", "Lk", "skip"})
    ->Args({32, 32768, 0})
    ->Args({32, 32768, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_TEMPLATE(BM_cuda_layer, __nv_bfloat16)
    ->ArgsProduct({{512, 2048, 8192}, {1, 0}})
    ->ArgNames({"L", "causal"})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_cuda_layer_decode, __nv_bfloat16)
    ->Arg(512)
    ->Arg(8192)
    ->ArgName("cache")
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
