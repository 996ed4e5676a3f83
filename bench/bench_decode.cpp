// SPDX-License-Identifier: MIT
// Decoding at memory speed: K/V in fp32, fp16 and bf16, GQA and MHA, against a read-bandwidth
// ceiling measured in the same process; and prefill throughput with half-precision K/V
// against fp32 K/V.
//
// BM_read_ceiling: a vectorized sum over a 1 GiB buffer (far beyond the last-level cache),
// split over `threads` of alibi's pool: the bytes per second a streaming kernel can read
// (stream_sum: eight packet accumulators; before 2026-12-03, Eigen's sum(),
// which read about a fifth less on this project's guest).
// BM_read_prefetched: the same sum with a software prefetch of every line 2 KiB ahead, as
// the decode steps with half-precision K/V request their next tile: what such requests cost.
// BM_decode_kv: one query token (32 query heads, D 128) against k_len cached keys (1024, 4096,
// 32768), each step after a read that leaves none of its K/V in cache (steps_against_ceiling;
// skip 2: far-tile skipping with key-norm bounds kept beside the cache, as kv_cache does);
// counters KV_GB/s (the K/V bytes of the call over its median time), ceiling_GB/s (the
// median rate of those reads, with the same thread count) and of_ceiling (the first over the
// second).
// BM_decode_arith: the same step with K/V views whose key stride is 0 (every key reads the
// same row, which stays in L1): all of the step's arithmetic and bookkeeping without its
// memory traffic; counter bound_GB/s, the K/V bytes the real step streams over this time,
// the most a step could read per second before its arithmetic, not memory, limits it.
// BM_fma_floor: the multiply-adds of such a step (32 query heads, D 128, k_len keys) as
// independent packet FMAs in registers on one thread: the core's peak, the least time any
// step's arithmetic can take; bound_GB/s as BM_decode_arith's, for fp16 K/V.
// BM_decode_tokens_outer: BM_decode_kv (skipping off) with K and V stored with the tokens
// outermost, (1, k_len, kv_heads, 128) (FlashAttention's layout, and kv_cache's before
// 2026-12-04), each head's rows a whole token apart, against the heads outermost of
// BM_decode_kv: what that layout costs a step. BM_decode_tokens_outer_skip: the same with
// far-tile skipping on and the key norms computed by the call (BM_decode_kv's skip 1).
// BM_decode_blocked / BM_decode_arith_blocked: the same with K in blocks of 16 keys
// (alibi/core/key_blocks.hpp; a copy of the same keys).
// BM_decode_after_idle: an fp16 MHA step over 4096 keys after the pool sat idle (0 or 20 ms),
// 1 and 2 threads: whether a second thread pays off between a serving loop's short calls, and
// the CPU the idle process uses afterwards.
// BM_prefill_kv: causal prefill, 16 heads; GFLOP/s (4 H L^2 D / 2).
// BM_small_products: the decode products alone on one cache-resident tile, GFLOP/s (product
// 2: Q K^T from K in blocks).
// BM_tile_products: both products of a tile (Q K^T, then P V) on one cache-resident tile,
// with or without the step's prefetch schedule (paced_prefetch) ticking in them: what the
// schedule's bookkeeping costs the arithmetic.
// BM_stream_products: a GQA-8 half-precision step's products alone, tile after tile over
// the step's K/V (streamed 1) or over L1-resident rows (0), with the step's prefetch schedule
// and without its softmax and bookkeeping; counters as BM_decode_kv.
// BM_overlap_probe: a loop of a GQA-8 fp16 decode step's shape with none of alibi's kernel
// (fp16 widened and used by four rows, 64 KiB per tile, the next tile's lines requested as
// it goes): how far this machine overlaps such arithmetic with memory; counters as
// BM_decode_kv.
// BM_serve_decode: one decode step of 16 sequences whose contexts are spread evenly over
// 1024..8192 tokens (72k in all), 32 query heads, D 128, MHA (32 KV heads) or GQA-8 (4),
// K/V in fp16 or int8. layout 0: alibi::attention over one slot of 8192 tokens per sequence
// (k_lengths; kv_cache's layout), 1: ragged_attention over the same slots (contiguous_kv),
// 2: ragged_attention over pages of 16 tokens, in a shuffled page order (paged_kv). Cold
// caches and counters as BM_decode_kv, the bytes those of the tokens in use.
// BM_serve_long: one sequence's decode step over 16k or 128k tokens in pages of 16 (fp16,
// MHA, slopes as generated), far-tile skipping on with the pages' key norms; counter
// tiles_read: the fraction of the (head, tile) pairs the step read.
// BM_serve_prefill: a 4096-token prompt's attention (32 heads, D 128, fp16 K/V already in the
// cache, causal, skipping off), warm caches: 0 one attention() call over the whole prompt,
// 1 attention() in chunks of 512 query rows over the keys so far, 2 ragged_attention in the
// same chunks over pages of 16 tokens. Counter GFLOP/s (4 x the causal pairs x D).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <sys/resource.h>

#include <benchmark/benchmark.h>

#include <alibi/backend/eigen/kv_tiles.hpp>
#include <alibi/backend/host/small_rows.hpp>
#include <alibi/backend/host/workspace.hpp>
#include <alibi/serving.hpp>

#include "common.hpp"
#include "decode_views.hpp"

namespace {

using alibi_bench::decode_views;
using alibi_bench::index_t;
using alibi_bench::make_decode_views;
using alibi_bench::read_tokens_outer;

/// Storage on 64-byte boundaries, as an engine's allocator (and alibi's kv_cache) gives: a
/// K/V row that starts 16 bytes past a line makes every packet load span two cache lines.
template <class T>
using aligned_vector = std::vector<T, alibi::detail::cpu::aligned_allocator<T>>;

/// x, as a value the compiler cannot see. Not benchmark::DoNotOptimize on the variable: GCC 12
/// gave stream_products a garbage head dimension after it (its "+m,r" operand).
index_t opaque(index_t x) {
  volatile index_t v = x;
  return v;
}

/// A buffer of floats with a cheap deterministic fill (an LCG: gigabytes of normal samples
/// would take longer than the benchmarks), values in [-1, 1).
aligned_vector<float> filled(std::size_t n, std::uint64_t seed) {
  aligned_vector<float> x(n);
  std::uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (float& e : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
  }
  return x;
}

/// filled(n, seed) rounded to the K/V storage type T.
template <class T>
aligned_vector<T> filled_as(std::size_t n, std::uint64_t seed) {
  const aligned_vector<float> x = filled(n, seed);
  return aligned_vector<T>(x.begin(), x.end());
}

/// Calls f(T{}) for the K/V storage type of a benchmark argument: 0 fp32, 1 fp16, 2 bf16.
template <class F>
void with_kv_type(std::int64_t code, F&& f) {
  switch (code) {
    case 0:
      f(float{});
      break;
    case 1:
      f(Eigen::half{});
      break;
    default:
      f(Eigen::bfloat16{});
      break;
  }
}

/// Sum of n floats: eight packet accumulators over the buffer front to back, then the tail.
/// Why not Eigen's sum(): on this project's Zen 5 guest, one thread over 1 GiB, Eigen's sum
/// read 32-33 GB/s and its speed moved with code alignment (the same source compiled with
/// -falign-functions=64 -falign-loops=32 read 41 in one build), while this loop read 40-41
/// in every build; a ceiling must be the best streaming read, or the ratios against it
/// flatter the kernels. With Ahead > 0 the loop also requests each line Ahead bytes ahead
/// into L1 (prefetcht0 on x86), as the decode steps with half-precision K/V do: what such
/// requests cost a plain stream (BM_read_prefetched).
template <index_t Ahead = 0>
float stream_sum(const float* p, index_t n) {
  namespace ei = Eigen::internal;
  using alibi::detail::cpu::packet;
  constexpr index_t lanes = alibi::detail::cpu::lanes, ways = 8;
  packet acc[ways];
  for (packet& a : acc) a = ei::pset1<packet>(0.0f);
  index_t i = 0;
  for (; i + ways * lanes <= n; i += ways * lanes) {
    if constexpr (Ahead > 0) {
      const char* const ahead = reinterpret_cast<const char*>(p + i) + Ahead;
      constexpr auto bytes = static_cast<index_t>(ways * lanes * sizeof(float));
      for (index_t line = 0; line < bytes; line += 64) {
        __builtin_prefetch(ahead + line, 0, 3);
        asm volatile("");  // keeps every request (kv_tiles.hpp says why)
      }
    }
    for (index_t u = 0; u < ways; ++u)
      acc[u] = ei::padd(acc[u], ei::ploadu<packet>(p + i + u * lanes));
  }
  for (index_t u = 1; u < ways; ++u) acc[0] = ei::padd(acc[0], acc[u]);
  float sum = ei::predux(acc[0]);
  for (; i < n; ++i) sum += p[i];
  return sum;
}

/// The ceiling's buffer: 1 GiB of floats, far beyond the last-level cache.
const aligned_vector<float>& ceiling_buffer() {
  static const aligned_vector<float> buf = filled(std::size_t(1) << 28, 7);
  return buf;
}

/// One sum over the n floats from p split over `threads` threads (stream_sum<Ahead>): its
/// bytes per second and the seconds it took.
template <index_t Ahead = 0>
std::pair<double, double> timed_read(const float* p, index_t n, int threads) {
  std::vector<float> partial(static_cast<std::size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  alibi::detail::parallel_for(threads, threads, [&](index_t t) {
    const index_t chunk = n / threads;
    partial[static_cast<std::size_t>(t)] = stream_sum<Ahead>(p + t * chunk, chunk);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(partial.data());
  return {static_cast<double>(n) * 4 / s, s};
}

/// One sum over the whole ceiling's buffer (timed_read).
template <index_t Ahead = 0>
std::pair<double, double> ceiling_sample(int threads) {
  const aligned_vector<float>& buf = ceiling_buffer();
  return timed_read<Ahead>(buf.data(), static_cast<index_t>(buf.size()), threads);
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const std::size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : (x[h - 1] + x[h]) / 2;
}

/// Bytes per second of stream_sum<Ahead> over 1 GiB with `threads` threads: median of 5.
template <index_t Ahead = 0>
double read_ceiling(int threads) {
  std::vector<double> rates;
  for (int rep = 0; rep < 5; ++rep) rates.push_back(ceiling_sample<Ahead>(threads).first);
  return median(rates);
}

void BM_read_ceiling(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double rate = 0;
  for (auto _ : state) rate = read_ceiling(threads);
  state.counters["GB/s"] = rate / 1e9;
}

// The ceiling's sum with a software prefetch of every line 2 KiB ahead: median of 5.
void BM_read_prefetched(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  double rate = 0;
  for (auto _ : state) rate = read_ceiling<2048>(threads);
  state.counters["GB/s"] = rate / 1e9;
}

/// K and V of shape (1, Hkv, Lk, 128) in storage type T, shared across benchmarks; and the
/// same K in blocks, made on first use.
template <class T>
struct kv_store {
  aligned_vector<T> k, v, kb;
  index_t hkv = 0, lk = 0;

  const aligned_vector<T>& blocks() {
    if (kb.empty()) {
      kb.resize(
          static_cast<std::size_t>(hkv * alibi::key_block_count(lk) * 128 * alibi::keys_per_block));
      alibi::store_key_blocks(alibi::make_view<const T>(k.data(), 1, hkv, lk, 128),
                              alibi::make_key_blocks(kb.data(), 1, hkv, lk, 128));
    }
    return kb;
  }
  static kv_store& get(index_t hkv, index_t lk) {
    static std::map<std::pair<index_t, index_t>, std::unique_ptr<kv_store>> stores;
    auto& s = stores[{hkv, lk}];
    if (!s) {
      s = std::make_unique<kv_store>();
      const auto n = static_cast<std::size_t>(hkv * lk * 128);
      s->k = filled_as<T>(n, 1);
      s->v = filled_as<T>(n, 2);
      s->hkv = hkv;
      s->lk = lk;
    }
    return *s;
  }
};

/// The bytes of the ceiling's buffer read before every step (a window that moves through
/// the buffer, so no window was read recently): more than this guest's last-level cache.
constexpr index_t flush_window_bytes = index_t(256) << 20;

/// Reads the next flush_window_bytes of the ceiling's buffer with `threads` threads (the
/// windows go round the 1 GiB buffer): its bytes per second and the seconds it took.
std::pair<double, double> window_sample(int threads) {
  static index_t next = 0;  // the next window's first float
  const aligned_vector<float>& buf = ceiling_buffer();
  const index_t n = flush_window_bytes / index_t(sizeof(float)),
                windows = static_cast<index_t>(buf.size()) / n;
  const float* const w = buf.data() + next;
  next = (next / n + 1) % windows * n;
  return timed_read(w, n, threads);
}

/// Times step() once per iteration (manual time), each step after an untimed read of a
/// window of the ceiling's buffer (window_sample), whose rate is that moment's ceiling
/// sample. Why a read before every step: a step follows steps of the other layers of a
/// model, which leave none of its K/V in cache; back to back, a step finds part of the
/// last one's K/V in the last-level cache (measured on this project's Zen 5 guest: 32
/// query heads, D 128, 4096 keys, fp16 MHA K/V of 64 MiB read at 1.04 of the ceiling, the
/// same K/V with the tokens outermost at 0.76). And why a ceiling sample beside every step:
/// this machine's bandwidth drifts by 1.5x within a run, so a ceiling measured once per
/// process made ratios of 0.5 or 1.3 for the same code. Counters: KV_GB/s (`bytes` over the
/// median step), ceiling_GB/s (the median sample) and of_ceiling (the first over the second).
template <class Step>
void steps_against_ceiling(benchmark::State& state, int threads, double bytes, Step&& step) {
  step();  // untimed: the first read of freshly written K/V pages is slow on some guests
  std::vector<double> times, rates;
  for (auto _ : state) {
    rates.push_back(window_sample(threads).first);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    times.push_back(s);
  }
  const double rate = bytes / median(times), ceiling = median(rates);
  state.counters["KV_GB/s"] = rate / 1e9;
  state.counters["ceiling_GB/s"] = ceiling / 1e9;
  state.counters["of_ceiling"] = rate / ceiling;
}

/// Causal attention with far-tile skipping off: the dense kernel every key is read by.
alibi::attention_params dense_causal() {
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = false;
  return p;
}

/// One decode step: q (32, 128) and out (32, 128) of one sequence, K as rows or in blocks
/// (when `blocked`).
template <class T>
void decode_call(const alibi::backend::eigen& be, const aligned_vector<float>& q,
                 const decode_views<T>& kv, bool blocked, aligned_vector<float>& out,
                 const alibi::attention_params& p) {
  const index_t hq = 32, d = 128;
  const auto qv = alibi::make_view<const float>(q.data(), 1, hq, 1, d);
  const auto ov = alibi::make_view(out.data(), 1, hq, 1, d);
  if (blocked)
    alibi::attention(be, qv, kv.kb, kv.v, ov, p);
  else
    alibi::attention(be, qv, kv.k, kv.v, ov, p);
  benchmark::DoNotOptimize(out.data());
}

/// skip: 0 off, 1 on (the call computes the key norms), 2 on with the key-norm bounds kept
/// beside the cache (computed once, as kv_cache keeps them). blocked: K in blocks.
/// tokens_outer: K and V read as (1, lk, hkv, d) in memory instead of (1, hkv, lk, d) (the
/// same buffers: the time does not depend on the values).
template <class T>
void decode(benchmark::State& state, index_t lk, index_t hkv, int skip, int threads,
            bool blocked = false, bool tokens_outer = false) {
  const index_t hq = 32, d = 128;
  kv_store<T>& kv = kv_store<T>::get(hkv, lk);
  decode_views<T> views = make_decode_views<T>(kv.k.data(), blocked ? kv.blocks().data() : nullptr,
                                               kv.v.data(), hkv, lk, d, true);
  if (tokens_outer) read_tokens_outer(views, kv.k.data(), kv.v.data(), hkv, lk, d);
  const aligned_vector<float> q = filled(static_cast<std::size_t>(hq * d), 3);
  aligned_vector<float> out(q.size());
  alibi::attention_params p;
  p.mask.causal = true;
  p.skip_far_tiles = skip != 0;
  const alibi::backend::eigen be{threads};
  const index_t blocks = (lk + alibi::key_norm_block - 1) / alibi::key_norm_block;
  std::vector<float> bounds(static_cast<std::size_t>(hkv * blocks));
  if (skip == 2) {
    alibi::key_norm_bounds(views.k, alibi::make_view(bounds.data(), 1, hkv, blocks));
    p.key_norm_bounds = alibi::make_view<const float>(bounds.data(), 1, hkv, blocks);
  }
  steps_against_ceiling(state, threads, 2.0 * static_cast<double>(hkv * lk * d) * sizeof(T),
                        [&] { decode_call(be, q, views, blocked, out, p); });
}

/// The K/V of BM_serve_decode's 16 sequences in storage type T (Eigen::half or int8), in
/// both layouts: slots of serve_slot tokens, and pages of serve_page tokens.
constexpr index_t serve_seqs = 16, serve_slot = 8192, serve_page = 16;

index_t serve_context(index_t s) { return 1024 + s * (serve_slot - 1024) / (serve_seqs - 1); }

template <class T>
struct serve_store {
  index_t hkv = 0, pages = 0;
  aligned_vector<T> kc, vc, kp, vp;       // (seqs, hkv, slot, 128) / (pages, 16, hkv, 128)
  std::vector<float> ksc, vsc, ksp, vsp;  // int8 scales
  std::vector<std::int32_t> table;        // (seqs, slot / 16)
  std::vector<std::int64_t> lens;
  std::vector<float> norms;  // (pages, hkv)

  static serve_store& get(index_t hkv) {
    static std::map<index_t, std::unique_ptr<serve_store>> stores;
    auto& st = stores[hkv];
    if (!st) {
      st = std::make_unique<serve_store>();
      st->fill(hkv);
    }
    return *st;
  }

  void fill(index_t h) {
    constexpr index_t d = 128, per = serve_slot / serve_page;
    hkv = h;
    for (index_t s = 0; s < serve_seqs; ++s) {
      lens.push_back(serve_context(s));
      pages += (lens.back() + serve_page - 1) / serve_page;
    }
    const auto slots = static_cast<std::size_t>(serve_seqs * hkv * serve_slot);
    kc.resize(slots * d);
    vc.resize(slots * d);
    const auto tokens = static_cast<std::size_t>(pages * serve_page * hkv);
    kp.resize(tokens * d);
    vp.resize(tokens * d);
    if constexpr (alibi::is_int8_kv<T>) {
      ksc.resize(slots);
      vsc.resize(slots);
      ksp.resize(tokens);
      vsp.resize(tokens);
    }
    norms.assign(static_cast<std::size_t>(pages * hkv), 0.0f);
    // Pages in a shuffled order, as a pool that has served a while hands them out.
    std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
    for (index_t i = 0; i < pages; ++i)
      ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
    table.assign(static_cast<std::size_t>(serve_seqs * per), 0);
    std::size_t next = 0;
    for (index_t s = 0; s < serve_seqs; ++s)
      for (index_t i = 0; i < (lens[s] + serve_page - 1) / serve_page; ++i)
        table[static_cast<std::size_t>(s * per + i)] = ids[next++];
    const aligned_vector<float> row = filled(static_cast<std::size_t>(d) * 4099, 11);
    std::size_t r = 0;
    auto put = [&](T* dst, float* scale) {
      const float* src = row.data() + (r++ % 4096) * d;
      if constexpr (alibi::is_int8_kv<T>)
        *scale = alibi::paged_kv_cache<T>::quantize_int8(src, 1, d, dst);
      else
        for (index_t e = 0; e < d; ++e) dst[e] = static_cast<T>(src[e]);
    };
    for (index_t s = 0; s < serve_seqs; ++s)
      for (index_t j = 0; j < lens[s]; ++j)
        for (index_t g = 0; g < hkv; ++g) {
          const auto c = static_cast<std::size_t>((s * hkv + g) * serve_slot + j);
          const index_t page = table[static_cast<std::size_t>(s * per + j / serve_page)];
          const auto pi = static_cast<std::size_t>((page * serve_page + j % serve_page) * hkv + g);
          const bool q8 = alibi::is_int8_kv<T>;
          put(&kc[c * d], q8 ? &ksc[c] : nullptr);
          put(&vc[c * d], q8 ? &vsc[c] : nullptr);
          std::copy_n(&kc[c * d], d, &kp[pi * d]);
          std::copy_n(&vc[c * d], d, &vp[pi * d]);
          if (q8) {
            ksp[pi] = ksc[c];
            vsp[pi] = vsc[c];
          }
          // Every element is in [-1, 1] (int8: dequantized, too): norms at most sqrt(d).
          norms[static_cast<std::size_t>(page * hkv + g)] = std::sqrt(float(d));
        }
  }

  alibi::contiguous_kv<T> contiguous() const {
    alibi::contiguous_kv<T> kv;
    kv.k = alibi::make_view<const T>(kc.data(), serve_seqs, hkv, serve_slot, 128);
    kv.v = alibi::make_view<const T>(vc.data(), serve_seqs, hkv, serve_slot, 128);
    if constexpr (alibi::is_int8_kv<T>) {
      kv.k_scales = alibi::make_view<const float>(ksc.data(), serve_seqs, hkv, serve_slot);
      kv.v_scales = alibi::make_view<const float>(vsc.data(), serve_seqs, hkv, serve_slot);
    }
    kv.context_lens = alibi::make_view<const std::int64_t>(lens.data(), serve_seqs);
    return kv;
  }
  alibi::paged_kv<T> paged() const {
    alibi::paged_kv<T> kv;
    kv.k = alibi::make_view<const T>(kp.data(), pages, serve_page, hkv, 128);
    kv.v = alibi::make_view<const T>(vp.data(), pages, serve_page, hkv, 128);
    if constexpr (alibi::is_int8_kv<T>) {
      kv.k_scales = alibi::make_view<const float>(ksp.data(), pages, serve_page, hkv);
      kv.v_scales = alibi::make_view<const float>(vsp.data(), pages, serve_page, hkv);
    }
    kv.block_table =
        alibi::make_view<const std::int32_t>(table.data(), serve_seqs, serve_slot / serve_page);
    kv.context_lens = alibi::make_view<const std::int64_t>(lens.data(), serve_seqs);
    kv.page_key_norms = alibi::make_view<const float>(norms.data(), pages, hkv);
    return kv;
  }
  double bytes_in_use() const {
    double tokens = 0;
    for (std::int64_t n : lens) tokens += static_cast<double>(n);
    return tokens * static_cast<double>(hkv) *
           (2.0 * 128 * sizeof(T) + (alibi::is_int8_kv<T> ? 2 * sizeof(float) : 0));
  }
};

/// Arguments: layout (0 attention() over slots, 1 ragged over slots, 2 ragged over pages),
/// K/V type (1 fp16, 3 int8; int8 only ragged), KV heads, threads.
void BM_serve_decode(benchmark::State& state) {
  const auto layout = state.range(0);
  const index_t hkv = state.range(2), hq = 32, d = 128;
  const int threads = static_cast<int>(state.range(3));
  const aligned_vector<float> q = filled(static_cast<std::size_t>(serve_seqs * hq * d), 3);
  aligned_vector<float> out(q.size());
  std::vector<index_t> cu(serve_seqs + 1);
  for (index_t s = 0; s <= serve_seqs; ++s) cu[static_cast<std::size_t>(s)] = s;
  const alibi::attention_params p = dense_causal();
  const alibi::backend::eigen be{threads};
  auto run = [&](auto type) {
    using T = decltype(type);
    const serve_store<T>& st = serve_store<T>::get(hkv);
    const auto qv = alibi::make_view<const float>(q.data(), serve_seqs, hq, d);
    const auto ov = alibi::make_view(out.data(), serve_seqs, hq, d);
    const auto cv = alibi::make_view<const index_t>(cu.data(), serve_seqs + 1);
    steps_against_ceiling(state, threads, st.bytes_in_use(), [&] {
      if constexpr (alibi::is_int8_kv<T>) {
        if (layout == 1)
          alibi::ragged_attention(be, qv, cv, st.contiguous(), ov, p);
        else
          alibi::ragged_attention(be, qv, cv, st.paged(), ov, p);
      } else if (layout == 0) {
        alibi::attention_params pl = p;
        pl.k_lengths = alibi::make_view<const index_t>(st.lens.data(), serve_seqs);
        const alibi::contiguous_kv<T> kv = st.contiguous();
        alibi::attention(be, alibi::make_view<const float>(q.data(), serve_seqs, hq, 1, d), kv.k,
                         kv.v, alibi::make_view(out.data(), serve_seqs, hq, 1, d), pl);
      } else if (layout == 1) {
        alibi::ragged_attention(be, qv, cv, st.contiguous(), ov, p);
      } else {
        alibi::ragged_attention(be, qv, cv, st.paged(), ov, p);
      }
      benchmark::DoNotOptimize(out.data());
    });
  };
  if (state.range(1) == 3)
    run(std::int8_t{});
  else
    run(Eigen::half{});
}

/// One sequence of `len` tokens (paged fp16, MHA, 32 heads), skipping on: what a step costs
/// as the context grows. Arguments: len, threads.
void BM_serve_long(benchmark::State& state) {
  const index_t len = state.range(0), h = 32, d = 128, ps = 16, pages = (len + ps - 1) / ps;
  const int threads = static_cast<int>(state.range(1));
  using T = Eigen::half;
  static std::map<index_t, std::unique_ptr<alibi::paged_kv_cache<T>>> caches;
  auto& cache = caches[len];
  if (!cache) {
    cache = std::make_unique<alibi::paged_kv_cache<T>>(pages, ps, h, d, 1, pages);
    const index_t seq = cache->add_sequence();
    const aligned_vector<float> rows = filled(static_cast<std::size_t>(4096 * h * d), 13);
    for (index_t j = 0; j < len; j += 4096) {
      const index_t n = std::min<index_t>(4096, len - j);
      const auto kv = alibi::make_view<const float>(rows.data(), n, h, d);
      cache->append(seq, kv, kv);
    }
  }
  const aligned_vector<float> q = filled(static_cast<std::size_t>(h * d), 3);
  aligned_vector<float> out(q.size());
  const std::vector<index_t> cu = {0, 1};
  alibi::attention_params p;
  p.mask.causal = true;
  alibi::attention_stats stats;
  p.stats = &stats;
  const alibi::backend::eigen be{threads};
  steps_against_ceiling(state, threads, 2.0 * static_cast<double>(len * h * d) * sizeof(T), [&] {
    alibi::ragged_attention(be, alibi::make_view<const float>(q.data(), 1, h, d),
                            alibi::make_view<const index_t>(cu.data(), 2), cache->view(),
                            alibi::make_view(out.data(), 1, h, d), p);
    benchmark::DoNotOptimize(out.data());
  });
  state.counters["tiles_read"] = static_cast<double>(stats.tiles_computed) /
                                 static_cast<double>(stats.tiles_computed + stats.tiles_skipped);
}

/// Arguments: way (0 whole, 1 chunks over slots, 2 chunks over pages), threads.
void BM_serve_prefill(benchmark::State& state) {
  const index_t L = 4096, h = 32, d = 128, ps = 16, chunk = 512;
  const auto way = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  using T = Eigen::half;
  static const aligned_vector<T> k = filled_as<T>(static_cast<std::size_t>(L * h * d), 21),
                                 v = filled_as<T>(static_cast<std::size_t>(L * h * d), 22);
  // The same tokens in pages, in order: page p holds tokens [16 p, 16 p + 16) of every head.
  static const std::pair<aligned_vector<T>, aligned_vector<T>> pages = [&] {
    aligned_vector<T> kp(k.size()), vp(v.size());
    for (index_t g = 0; g < h; ++g)
      for (index_t j = 0; j < L; ++j) {
        std::copy_n(&k[static_cast<std::size_t>((g * L + j) * d)], d,
                    &kp[static_cast<std::size_t>((j * h + g) * d)]);
        std::copy_n(&v[static_cast<std::size_t>((g * L + j) * d)], d,
                    &vp[static_cast<std::size_t>((j * h + g) * d)]);
      }
    return std::make_pair(std::move(kp), std::move(vp));
  }();
  std::vector<std::int32_t> table(static_cast<std::size_t>(L / ps));
  for (index_t i = 0; i < L / ps; ++i)
    table[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  const aligned_vector<float> q = filled(static_cast<std::size_t>(L * h * d), 3);
  aligned_vector<float> out(q.size());
  const alibi::attention_params p = dense_causal();
  const alibi::backend::eigen be{threads};
  const auto kv = alibi::make_view<const T>(k.data(), 1, h, L, d);
  const auto vv = alibi::make_view<const T>(v.data(), 1, h, L, d);
  // q and out as (L, h, d) rows: (1, h, L, d) views of the same memory for attention().
  auto step = [&] {
    if (way == 0) {
      alibi::attention(be, alibi::view_bshd<const float>(q.data(), 1, L, h, d), kv, vv,
                       alibi::view_bshd(out.data(), 1, L, h, d), p);
    }
    for (index_t c = 0; way != 0 && c < L / chunk; ++c) {
      const index_t n = (c + 1) * chunk;
      const float* qc = q.data() + c * chunk * h * d;
      float* oc = out.data() + c * chunk * h * d;
      if (way == 1) {
        const auto kc =
            alibi::make_strided_view<const T, 4>(k.data(), {1, h, n, d}, {h * L * d, L * d, d, 1});
        const auto vc =
            alibi::make_strided_view<const T, 4>(v.data(), {1, h, n, d}, {h * L * d, L * d, d, 1});
        alibi::attention(be, alibi::view_bshd<const float>(qc, 1, chunk, h, d), kc, vc,
                         alibi::view_bshd(oc, 1, chunk, h, d), p);
      } else {
        alibi::paged_kv<T> pk;
        pk.k = alibi::make_view<const T>(pages.first.data(), L / ps, ps, h, d);
        pk.v = alibi::make_view<const T>(pages.second.data(), L / ps, ps, h, d);
        pk.block_table = alibi::make_view<const std::int32_t>(table.data(), 1, L / ps);
        const std::int64_t len = n;
        pk.context_lens = alibi::make_view<const std::int64_t>(&len, 1);
        const index_t cu[] = {0, chunk};
        alibi::ragged_attention(be, alibi::make_view<const float>(qc, chunk, h, d),
                                alibi::make_view<const index_t>(cu, 2), pk,
                                alibi::make_view(oc, chunk, h, d), p);
      }
    }
    benchmark::DoNotOptimize(out.data());
  };
  step();
  std::vector<double> times;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    times.push_back(s);
  }
  // Causal pairs: L (L + 1) / 2 per head; 2 products of D multiply-adds each.
  state.counters["GFLOP/s"] = 4.0 * h * d * (L * (L + 1) / 2.0) / median(times) / 1e9;
}

/// CPU seconds (user + system) this process has used so far.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Args: threads, idle ms. A serving loop's step: an fp16 MHA decode step (32 heads, D 128,
// 4096 keys, skipping off) after a single-threaded read that leaves none of its K/V in cache
// (the pool's workers take no part in it) and `idle ms` with nothing to do (the rest of the
// engine's step, a wait for requests); manual time: the step alone. Counters: ms (the median
// step), idle_cpu_0_500ms and idle_cpu_500_1000ms (CPU seconds the process used while idle
// over those windows after the last step: the workers' spinning, then nothing).
void BM_decode_after_idle(benchmark::State& state) {
  using T = Eigen::half;
  const int threads = static_cast<int>(state.range(0));
  const auto idle = std::chrono::milliseconds(state.range(1));
  const index_t lk = 4096, hkv = 32, hq = 32, d = 128;
  kv_store<T>& kv = kv_store<T>::get(hkv, lk);
  const decode_views<T> views =
      make_decode_views<T>(kv.k.data(), nullptr, kv.v.data(), hkv, lk, d, true);
  const aligned_vector<float> q = filled(static_cast<std::size_t>(hq * d), 3);
  aligned_vector<float> out(q.size());
  const alibi::attention_params p = dense_causal();
  const alibi::backend::eigen be{threads};
  decode_call(be, q, views, false, out, p);
  std::vector<double> times;
  for (auto _ : state) {
    window_sample(1);
    std::this_thread::sleep_for(idle);
    const auto t0 = std::chrono::steady_clock::now();
    decode_call(be, q, views, false, out, p);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(s);
    times.push_back(s);
  }
  const double c0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double c1 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double c2 = process_cpu_seconds();
  state.counters["ms"] = 1e3 * median(times);
  state.counters["idle_cpu_0_500ms"] = c1 - c0;
  state.counters["idle_cpu_500_1000ms"] = c2 - c1;
}

// Args: k_len, kv heads, K/V type (0 fp32, 1 fp16, 2 bf16), skip (0 off, 1 on, 2 on with
// the cache's key-norm bounds), threads.
void BM_decode_kv(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const auto skip = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  with_kv_type(state.range(2),
               [&](auto type) { decode<decltype(type)>(state, lk, hkv, skip, threads); });
}

// Args: as BM_decode_kv; K in blocks.
void BM_decode_blocked(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const auto skip = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  with_kv_type(state.range(2),
               [&](auto type) { decode<decltype(type)>(state, lk, hkv, skip, threads, true); });
}

// Args: k_len, kv heads, K/V type, threads; skipping off, K and V with the tokens outermost
// (see the file's head).
void BM_decode_tokens_outer(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const int threads = static_cast<int>(state.range(3));
  with_kv_type(state.range(2),
               [&](auto type) { decode<decltype(type)>(state, lk, hkv, 0, threads, false, true); });
}

// Args: as BM_decode_tokens_outer; skipping on, the call computing the key norms (skip 1).
void BM_decode_tokens_outer_skip(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const int threads = static_cast<int>(state.range(3));
  with_kv_type(state.range(2),
               [&](auto type) { decode<decltype(type)>(state, lk, hkv, 1, threads, false, true); });
}

/// A decode step (as decode(), skipping off) on K/V views with a key stride of 0: each KV
/// head's keys all read one row, so the products, softmax and bookkeeping run as in the real
/// step (the same data-independent work, prefetch requests included) with every byte in L1.
template <class T>
void decode_arith(benchmark::State& state, index_t lk, index_t hkv, int threads,
                  bool blocked = false) {
  const index_t hq = 32, d = 128;
  const aligned_vector<T> k = filled_as<T>(static_cast<std::size_t>(hkv * d), 1),
                          v = filled_as<T>(static_cast<std::size_t>(hkv * d), 2);
  const aligned_vector<float> q = filled(static_cast<std::size_t>(hq * d), 3);
  aligned_vector<float> out(q.size());
  const alibi::attention_params p = dense_causal();
  const alibi::backend::eigen be{threads};
  const aligned_vector<T> kb = filled_as<T>(static_cast<std::size_t>(hkv * d * 16), 1);
  const decode_views<T> views =
      make_decode_views<T>(k.data(), kb.data(), v.data(), hkv, lk, d, false);
  alibi_bench::timed_steps(state, [&] { decode_call(be, q, views, blocked, out, p); });
  const double bytes = 2.0 * static_cast<double>(hkv * lk * d) * sizeof(T);
  state.counters["bound_GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: k_len, kv heads, K/V type (0 fp32, 1 fp16, 2 bf16), threads.
void BM_decode_arith(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const int threads = static_cast<int>(state.range(3));
  with_kv_type(state.range(2),
               [&](auto type) { decode_arith<decltype(type)>(state, lk, hkv, threads); });
}

// Args: as BM_decode_arith; K in blocks.
void BM_decode_arith_blocked(benchmark::State& state) {
  const index_t lk = state.range(0), hkv = state.range(1);
  const int threads = static_cast<int>(state.range(3));
  with_kv_type(state.range(2),
               [&](auto type) { decode_arith<decltype(type)>(state, lk, hkv, threads, true); });
}

/// The FMAs of a decode step at the core's peak: Hq k_len (D + Dv) multiply-adds (Q K^T and
/// P V) as packet FMAs in 16 independent chains in registers, which no load, conversion or
/// dependency holds back, on one thread. No step's arithmetic can take less on one core:
/// with bound_GB/s (the K/V bytes of the fp16 step over this time) it says how much of the
/// step's memory time its FMAs alone fill.
void BM_fma_floor(benchmark::State& state) {
  namespace ei = Eigen::internal;
  namespace cpu = alibi::detail::cpu;
  const index_t lk = state.range(0), hkv = state.range(1), hq = 32, d = 128;
  constexpr int chains = 16;
  const index_t steps = opaque(hq * lk * 2 * d / (chains * cpu::lanes));
  const cpu::packet x = ei::pset1<cpu::packet>(0.999f), y = ei::pset1<cpu::packet>(1e-4f);
  float sink = 0;
  for (auto _ : state) {
    // Each chain starts from its own value: chains the compiler can prove equal, it merges.
    cpu::packet acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = ei::pset1<cpu::packet>(1e-3f * static_cast<float>(c));
    for (index_t i = 0; i < steps; ++i) {
#pragma GCC unroll 16
      for (int c = 0; c < chains; ++c) acc[c] = ei::pmadd(acc[c], x, y);
    }
    for (int c = 1; c < chains; ++c) acc[0] = ei::padd(acc[0], acc[c]);
    sink += ei::predux(acc[0]);
  }
  benchmark::DoNotOptimize(sink);
  const double bytes = 2.0 * static_cast<double>(hkv * lk * d) * sizeof(Eigen::half);
  state.counters["bound_GB/s"] =
      benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void prefill(benchmark::State& state, index_t len, index_t d, int threads) {
  const index_t h = 16;
  const auto n = static_cast<std::size_t>(h * len * d);
  const aligned_vector<float> q = filled(n, 4);
  const aligned_vector<T> k = filled_as<T>(n, 5), v = filled_as<T>(n, 6);
  aligned_vector<float> out(n);
  const alibi::attention_params p = dense_causal();
  const alibi::backend::eigen be{threads};
  auto step = [&] {
    alibi::attention(be, alibi::make_view<const float>(q.data(), 1, h, len, d),
                     alibi::make_view<const T>(k.data(), 1, h, len, d),
                     alibi::make_view<const T>(v.data(), 1, h, len, d),
                     alibi::make_view(out.data(), 1, h, len, d), p);
    benchmark::DoNotOptimize(out.data());
  };
  alibi_bench::timed_steps(state, step);
  state.counters["GFLOP/s"] =
      benchmark::Counter(alibi_bench::attention_flops(h, len, len, d, true) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// Args: length, head_dim, K/V type (0 fp32, 1 fp16, 2 bf16), threads.
void BM_prefill_kv(benchmark::State& state) {
  const index_t len = state.range(0), d = state.range(1);
  const int threads = static_cast<int>(state.range(3));
  with_kv_type(state.range(2), [&](auto type) { prefill<decltype(type)>(state, len, d, threads); });
}

/// m query rows (D 128) and their scores and output over 128-key tiles: the buffers of
/// small_products, tile_products and stream_products.
struct tile_rows_buffers {
  aligned_vector<float> q, s, o;
  std::vector<const float*> qr, pr;
  std::vector<float*> sr, orow;
  tile_rows_buffers(index_t m, index_t d, index_t bk)
      : q(filled(static_cast<std::size_t>(m * d), 3)),
        s(static_cast<std::size_t>(m * bk)),
        o(static_cast<std::size_t>(m * d)),
        qr(static_cast<std::size_t>(m)),
        pr(qr.size()),
        sr(qr.size()),
        orow(qr.size()) {
    for (std::size_t t = 0; t < qr.size(); ++t) {
      qr[t] = q.data() + static_cast<index_t>(t) * d;
      sr[t] = s.data() + static_cast<index_t>(t) * bk;
      pr[t] = sr[t];
      orow[t] = o.data() + static_cast<index_t>(t) * d;
    }
  }
};

/// The decode products alone (backend/eigen/small_rows.hpp) on one 128-key tile with D 128,
/// small enough to stay in L1/L2: the arithmetic a decode step does per tile, without memory.
/// product: 0 Q K^T, 1 P V, 2 Q K^T from K in blocks.
template <class T>
void small_products(benchmark::State& state, index_t m, int product) {
  const bool scores = product != 1;
  namespace cpu = alibi::detail::cpu;
  // Not constants to the compiler: with a constant key count GCC warns about the products'
  // key-tail loop as if it could run past its bound.
  const index_t d = opaque(128), bk = opaque(128);
  const aligned_vector<T> k = filled_as<T>(static_cast<std::size_t>(bk * d), 1),
                          v = filled_as<T>(static_cast<std::size_t>(bk * d), 2);
  tile_rows_buffers rb(m, d, bk);
  std::fill(rb.s.begin(), rb.s.end(), 1.0f / static_cast<float>(bk));  // P V's probabilities
  const float* const* in = scores ? rb.qr.data() : rb.pr.data();
  float* const* out = scores ? rb.sr.data() : rb.orow.data();
  auto none = [] {};
  for (auto _ : state) {
    if (product == 2)  // the same bytes, read as blocks
      cpu::small_block_scores(in, m, k.data(), d * alibi::keys_per_block, 0, bk, d, out, none);
    else if (scores)
      cpu::small_scores(in, m, k.data(), d, bk, d, out, none);
    else
      cpu::small_pv(in, m, v.data(), d, bk, d, static_cast<const index_t*>(nullptr), 0, out, none);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(m * bk * d) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Args: rows, K/V type (0 fp32, 1 fp16, 2 bf16), product (0 Q K^T, 1 P V, 2 Q K^T from K
// in blocks).
void BM_small_products(benchmark::State& state) {
  const index_t m = state.range(0);
  const auto product = static_cast<int>(state.range(2));
  with_kv_type(state.range(1),
               [&](auto type) { small_products<decltype(type)>(state, m, product); });
}

/// One tile as a decode step runs its products: the schedule planned on the next tile (none
/// when `next` is false), Q K^T, the scores scaled to about 1 / 100 (finite and of one scale,
/// as probabilities after the softmax), P V, the rest of the requests.
template <class T>
void products_on_tile(tile_rows_buffers& rb, index_t m, index_t d, index_t bk,
                      alibi::detail::cpu::tile_rows<T> k, alibi::detail::cpu::tile_rows<T> v,
                      bool next, alibi::detail::cpu::tile_rows<T> next_k,
                      alibi::detail::cpu::tile_rows<T> next_v,
                      alibi::detail::cpu::paced_prefetch& ahead) {
  namespace cpu = alibi::detail::cpu;
  if (next)
    ahead.plan(next_k, d, next_v, d, bk);
  else
    ahead.plan_nothing();
  auto tick_k = [&]() { ahead.tick<cpu::paced_prefetch::keys_phase>(); };
  auto tick_v = [&]() { ahead.tick<cpu::paced_prefetch::values_phase>(); };
  if (k.blocked)
    cpu::small_block_scores(rb.qr.data(), m, k.data, k.ld, k.offset, bk, d, rb.sr.data(), tick_k);
  else
    cpu::small_scores(rb.qr.data(), m, k.data, k.ld, bk, d, rb.sr.data(), tick_k);
  for (float& x : rb.s) x *= 1e-2f;
  cpu::small_pv(rb.pr.data(), m, v.data, v.ld, bk, d, static_cast<const index_t*>(nullptr), 0,
                rb.orow.data(), tick_v);
  ahead.finish();
}

/// Q K^T then P V on one 128-key tile with D 128 (K as rows or in blocks), as a decode step
/// runs them on each tile. paced: the step's prefetch schedule plans this same tile as the
/// "next" one (its lines are in L1, so the requests cost only their issue) and ticks in both
/// products, as attend_heads' schedule does; otherwise the products tick into nothing.
template <class T>
void tile_products(benchmark::State& state, index_t m, bool blocked, bool paced) {
  namespace cpu = alibi::detail::cpu;
  const index_t d = opaque(128), bk = opaque(128);  // not constants, as in a step
  const aligned_vector<T> k = filled_as<T>(static_cast<std::size_t>(bk * d), 1),
                          v = filled_as<T>(static_cast<std::size_t>(bk * d), 2);
  tile_rows_buffers rb(m, d, bk);
  // K in blocks: the same bytes read as 8 blocks of (D, 16).
  const cpu::tile_rows<T> kt = blocked
                                   ? cpu::tile_rows<T>{k.data(), d * alibi::keys_per_block, true, 0}
                                   : cpu::tile_rows<T>{k.data(), d};
  const cpu::tile_rows<T> vt{v.data(), d};
  cpu::paced_prefetch ahead;
  for (auto _ : state) {
    products_on_tile(rb, m, d, bk, kt, vt, paced, kt, vt, ahead);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(m * bk * d) / 1e9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

/// A GQA-8 decode step's products alone (32 query heads on 8 KV heads, D 128, k_len 32768):
/// products_on_tile over every tile of every KV head in a step's order, the schedule
/// requesting the next tile, with none of the step's softmax and bookkeeping. streamed: over
/// the K/V of BM_decode_kv (K as rows or in blocks); otherwise over one tile per KV head
/// (every tile reads the same K/V rows, which stay in L1: the arithmetic alone).
template <class T>
void stream_products(benchmark::State& state, bool blocked, bool streamed) {
  namespace cpu = alibi::detail::cpu;
  const index_t hkv = 8, lk = 32768, m = 4;
  const index_t d = opaque(128), bk = opaque(128);
  kv_store<T>& kv = kv_store<T>::get(hkv, lk);
  const T* kb = blocked ? kv.blocks().data() : nullptr;
  tile_rows_buffers rb(m, d, bk);
  cpu::paced_prefetch ahead;
  const index_t tiles = lk / bk, head = lk * d, block_stride = d * alibi::keys_per_block;
  auto tile_of = [&](index_t h, index_t t) {
    const index_t j = streamed ? t * bk : 0;
    const cpu::tile_rows<T> k =
        blocked ? cpu::tile_rows<T>{kb + h * head + j * d, block_stride, true, 0}
                : cpu::tile_rows<T>{kv.k.data() + h * head + j * d, d};
    return std::make_pair(k, cpu::tile_rows<T>{kv.v.data() + h * head + j * d, d});
  };
  auto step = [&] {
    for (index_t h = 0; h < hkv; ++h)
      for (index_t t = 0; t < tiles; ++t) {
        const auto [k, v] = tile_of(h, t);
        const bool next = t + 1 < tiles;
        const auto [nk, nv] = tile_of(h, next ? t + 1 : t);
        products_on_tile(rb, m, d, bk, k, v, next, nk, nv, ahead);
      }
    benchmark::ClobberMemory();
  };
  steps_against_ceiling(state, 1, 2.0 * static_cast<double>(hkv * lk * d) * sizeof(T), step);
}

// Args: K/V type (1 fp16, 2 bf16), K layout (0 rows, 1 blocks), streamed (0, 1).
void BM_stream_products(benchmark::State& state) {
  const bool blocked = state.range(1) != 0, streamed = state.range(2) != 0;
  with_kv_type(state.range(0),
               [&](auto type) { stream_products<decltype(type)>(state, blocked, streamed); });
}

// Args: rows, K/V type (0 fp32, 1 fp16, 2 bf16), K layout (0 rows, 1 blocks), paced (0, 1).
void BM_tile_products(benchmark::State& state) {
  const index_t m = state.range(0);
  const bool blocked = state.range(2) != 0, paced = state.range(3) != 0;
  with_kv_type(state.range(1),
               [&](auto type) { tile_products<decltype(type)>(state, m, blocked, paced); });
}

/// BM_overlap_probe's bytes of K (or V) per tile: 128 keys of fp16 with D 128.
constexpr index_t probe_phase_bytes = index_t(32) << 10;

/// BM_overlap_probe's loop: one phase of a tile, 32 KiB of fp16 at `data`, `passes` times:
/// each 128 bytes widened once and used by 4 rows (16 FMAs with AVX-512), as a GQA-8 fp16
/// decode step's products use them. With Request, at step `due` (then every `burst` steps of
/// 128 bytes) the lines of the next tile (its K, then its V: next[0] and next[1]) due by the
/// end of the burst are requested, evenly over the tile's `steps` steps, from a plain pointer.
template <bool Request>
ALIBI_FORCEINLINE void probe_phase(const char* data, const float* q, int passes,
                                   const char* const* next, index_t steps, index_t burst,
                                   index_t& requested, index_t& due, index_t& step,
                                   alibi::detail::cpu::packet* acc) {
  namespace ei = Eigen::internal;
  namespace cpu = alibi::detail::cpu;
  constexpr index_t phase = probe_phase_bytes, chunk = 128, lines = 2 * phase / 64;
  constexpr index_t np = chunk / 2 / cpu::lanes;  // packets per chunk
  for (int r = 0; r < passes; ++r)
    for (index_t b = 0; b < phase; b += chunk, ++step) {
      if (Request && step == due)
        for (due += burst; requested * steps < std::min(due, steps) * lines; ++requested) {
          const index_t l = requested;
          __builtin_prefetch(l < lines / 2 ? next[0] + 64 * l : next[1] + 64 * (l - lines / 2), 0,
                             3);
          asm volatile("");  // keeps every request (kv_tiles.hpp says why)
        }
      const auto* h = reinterpret_cast<const Eigen::half*>(data + b);
      cpu::packet x[np];
      for (index_t c = 0; c < np; ++c) x[c] = cpu::load_shared(h + c * cpu::lanes);
      for (index_t t = 0; t < 4; ++t) {
        const auto w = ei::pset1<cpu::packet>(q[(4 * (b / chunk) + t) % 256]);
        for (index_t c = 0; c < np; ++c) acc[t * np + c] = ei::pmadd(w, x[c], acc[t * np + c]);
      }
    }
}

/// What this machine allows a decode step whose arithmetic and memory take about as long
/// as each other, with none of alibi's kernel: a loop of the GQA-8 fp16 step's shape. Per
/// 128-key tile, a phase over 32 KiB of fp16 "K", then one over 32 KiB of "V" (probe_phase),
/// 2048 tiles: the 128 MiB of BM_decode_kv/32768/8/1.
/// Args: layout, passes (2: about the arithmetic per byte of alibi's GQA-8 fp16 step, all
/// its overheads included; 1: half of it), burst (steps per request step: with passes 2,
/// lines per request, as paced_prefetch's pieces of 4 lines). layout 0: every tile reads the same
/// 64 KiB (cache-resident: the arithmetic alone); 1: K in one region and V in another, as a cache
/// keeps them, with the hardware prefetcher alone; 2: as 1 with the next tile's lines
/// requested; 3: as 2 with each tile's K and V next to each other in one region.
/// Counters as BM_decode_kv (one thread).
void BM_overlap_probe(benchmark::State& state) {
  namespace cpu = alibi::detail::cpu;
  const auto layout = static_cast<int>(state.range(0));
  const auto passes = static_cast<int>(state.range(1));
  const index_t burst = state.range(2);
  constexpr index_t phase = probe_phase_bytes, tiles = 2048, region = tiles * phase;
  constexpr index_t np = 128 / 2 / cpu::lanes;
  static const aligned_vector<Eigen::half> mem =
      filled_as<Eigen::half>(static_cast<std::size_t>(region), 7);  // 2 regions of fp16
  const char* const base = reinterpret_cast<const char*>(mem.data());
  auto k_of = [&](index_t t) {
    return layout == 0 ? base : base + (layout == 3 ? 2 * t : t) * phase;
  };
  auto v_of = [&](index_t t) {
    return layout == 0 ? base + phase
                       : base + (layout == 3 ? (2 * t + 1) * phase : region + t * phase);
  };
  const aligned_vector<float> q = filled(256, 3);
  float sink = 0;
  auto pass = [&] {
    cpu::packet acc[4 * np];
    for (auto& a : acc) a = Eigen::internal::pset1<cpu::packet>(0.0f);
    const index_t steps = 2 * passes * (phase / 128);
    for (index_t t = 0; t < tiles; ++t) {
      const index_t n = std::min(t + 1, tiles - 1);
      const char* const next[2] = {k_of(n), v_of(n)};
      index_t requested = 0, due = 0, step = 0;
      if (layout >= 2) {
        probe_phase<true>(k_of(t), q.data(), passes, next, steps, burst, requested, due, step, acc);
        probe_phase<true>(v_of(t), q.data(), passes, next, steps, burst, requested, due, step, acc);
      } else {
        probe_phase<false>(k_of(t), q.data(), passes, next, steps, burst, requested, due, step,
                           acc);
        probe_phase<false>(v_of(t), q.data(), passes, next, steps, burst, requested, due, step,
                           acc);
      }
    }
    for (index_t i = 1; i < 4 * np; ++i) acc[0] = Eigen::internal::padd(acc[0], acc[i]);
    sink += Eigen::internal::predux(acc[0]);
  };
  steps_against_ceiling(state, 1, static_cast<double>(2 * region), pass);
  benchmark::DoNotOptimize(sink);
}

// Steps per repetition of the benchmarks timed against the ceiling: each step costs a
// window's read too (window_sample), 4-9 ms on this project's guest.
constexpr int step_iterations = 20;

BENCHMARK(BM_read_ceiling)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_read_prefetched)->Arg(1)->Arg(2)->Iterations(1);
BENCHMARK(BM_small_products)->ArgsProduct({{1, 2, 4, 8}, {0, 1, 2}, {0, 1, 2}});
BENCHMARK(BM_tile_products)->ArgsProduct({{1, 4}, {0, 1, 2}, {0, 1}, {0, 1}});
BENCHMARK(BM_stream_products)
    ->Iterations(step_iterations)
    ->ArgsProduct({{1, 2}, {0, 1}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kv)
    ->Iterations(step_iterations)
    ->ArgsProduct({{1024, 4096, 32768}, {32, 8}, {0, 1, 2}, {0, 1, 2}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_tokens_outer)
    ->Iterations(step_iterations)
    ->ArgsProduct({{4096, 32768}, {32, 8}, {0, 1, 2}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_tokens_outer_skip)
    ->Iterations(step_iterations)
    ->ArgsProduct({{4096, 32768}, {32, 8}, {0, 1, 2}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_fma_floor)->Args({32768, 8})->Args({32768, 32})->UseRealTime();
BENCHMARK(BM_decode_arith)
    ->ArgsProduct({{32768}, {32, 8}, {0, 1, 2}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_blocked)
    ->Iterations(step_iterations)
    ->ArgsProduct({{4096, 32768}, {32, 8}, {0, 1, 2}, {0, 1, 2}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_arith_blocked)
    ->ArgsProduct({{32768}, {32, 8}, {0, 1, 2}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_overlap_probe)
    ->Iterations(step_iterations)
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2}, {1}})
    ->Args({2, 2, 4})
    ->Args({2, 2, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_after_idle)
    ->ArgsProduct({{1, 2}, {0, 20}})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_prefill_kv)
    ->ArgsProduct({{2048, 8192}, {64, 128}, {0, 1, 2}, {2}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK(BM_serve_decode)
    ->Iterations(step_iterations)
    ->ArgsProduct({{0, 1, 2}, {1}, {32, 4}, {1, 2}})
    ->ArgsProduct({{1, 2}, {3}, {32, 4}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_serve_prefill)
    ->Iterations(5)
    ->ArgsProduct({{0, 1, 2}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_serve_long)
    ->Iterations(step_iterations)
    ->ArgsProduct({{16384, 131072}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
