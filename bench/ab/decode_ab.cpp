// SPDX-License-Identifier: MIT
// In-process A/B of two versions of alibi's decode step (bench/scripts/decode-ab.sh builds it):
// calls alternate between the versions (which goes first alternates too), each version's
// streamed step (K/V from memory) and its arithmetic alone (a key stride of 0), with a read
// of a 256 MiB buffer before each streamed step as the memory ceiling of that moment. Why: on this
// project's shared guests, the bandwidth and the clock swing by 1.5x from one minute to the
// next, so two builds run one after the other compare their moments, not their code; here
// every round of A and B meets the same moment, and the medians over the rounds compare.
// Each streamed step follows a read of the buffer, so none of its K/V is in cache. The read
// runs on the main thread alone: with two threads, alibi's pool worker may sleep through it,
// and a two-thread step then includes the worker's wake-up (both versions alike).
//
// Usage: decode_ab type threads kv_heads layout [rounds] [k_len]
//   type: 0 fp32, 1 fp16, 2 bf16 K/V; layout: 0 K as rows (heads outermost), 1 K in blocks
//   of 16 keys, 2 K and V with the tokens outermost; or "A:B" (e.g. 0:2), version A with
//   layout A and version B with layout B (the same version twice compares two layouts).
// Prints the medians (ms): the ceiling's time for the step's K/V bytes, then A's and B's step
// and arithmetic, and B / A.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <Eigen/Core>

using index_t = std::ptrdiff_t;

void step_a(int type, int threads, const float* q, const void* k, const void* kb, const void* v,
            float* out, index_t hkv, index_t lk, bool streamed, int layout);
void step_b(int type, int threads, const float* q, const void* k, const void* kb, const void* v,
            float* out, index_t hkv, index_t lk, bool streamed, int layout);

namespace {

/// A sum of every float of a buffer with eight packet accumulators (so no chain of
/// additions, only memory, limits it): the bytes per second one thread reads.
float stream_sum(const float* x, std::size_t n) {
  namespace ei = Eigen::internal;
  using packet = ei::packet_traits<float>::type;
  constexpr std::size_t lanes = sizeof(packet) / sizeof(float);
  packet acc[8];
  for (packet& a : acc) a = ei::pset1<packet>(0.0f);
  for (std::size_t i = 0; i + 8 * lanes <= n; i += 8 * lanes)
#pragma GCC unroll 8
    for (std::size_t u = 0; u < 8; ++u)
      acc[u] = ei::padd(acc[u], ei::ploadu<packet>(x + i + u * lanes));
  for (int u = 1; u < 8; ++u) acc[0] = ei::padd(acc[0], acc[u]);
  return ei::predux(acc[0]);
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

/// Storage on 64-byte boundaries (Eigen's allocator with AVX-512), as an engine's allocator
/// gives: a large std::vector starts 16 bytes past a line, and then every packet load spans
/// two cache lines.
template <class T>
using aligned_vector = std::vector<T, Eigen::aligned_allocator<T>>;

template <class T>
void fill(aligned_vector<unsigned char>& buf, std::size_t n, unsigned seed) {
  buf.resize(n * sizeof(T));
  T* x = reinterpret_cast<T*>(buf.data());
  for (std::size_t i = 0; i < n; ++i)
    x[i] = T(static_cast<float>((i * 7919 + seed * 104729) % 1000) / 1000.0f - 0.5f);
}

int usage() {
  std::fprintf(stderr,
               "usage: decode_ab type(0 fp32, 1 fp16, 2 bf16) threads kv_heads "
               "layout(0 rows, 1 K in blocks, 2 tokens outermost; or A:B) [rounds, default 10] "
               "[k_len, default 32768]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage();
  const int type = std::atoi(argv[1]), threads = std::atoi(argv[2]);
  const index_t hkv = std::atol(argv[3]);
  // "L" for both versions, or "LA:LB" (e.g. 0:2) to compare two layouts, of one version
  // or of two.
  const std::string layouts = argv[4];
  const std::size_t colon = layouts.find(':');
  const int layout_a = std::atoi(layouts.c_str()),
            layout_b =
                colon == std::string::npos ? layout_a : std::atoi(layouts.c_str() + colon + 1);
  const int layout_of[2] = {layout_a, layout_b};
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 10;
  const index_t lk = argc > 6 ? std::atol(argv[6]) : 32768;
  if (type < 0 || type > 2 || threads < 1 || hkv < 1 || 32 % hkv != 0 ||
      std::min(layout_a, layout_b) < 0 || std::max(layout_a, layout_b) > 2 || rounds < 1 ||
      lk < 1) {
    std::fprintf(stderr,
                 "error: type must be 0, 1 or 2, threads >= 1, kv_heads a divisor of "
                 "32, layout 0, 1 or 2 (or two of them, A:B), rounds >= 1, k_len >= 1\n");
    return usage();
  }
  const index_t d = 128, hq = 32, blocks = (lk + 15) / 16;
  const std::size_t n = static_cast<std::size_t>(hkv * lk * d);
  const std::size_t nb = static_cast<std::size_t>(hkv * blocks * 16 * d);
  aligned_vector<unsigned char> k, kb, v;
  if (type == 0) {
    fill<float>(k, n, 1), fill<float>(kb, nb, 2), fill<float>(v, n, 3);
  } else if (type == 1) {
    fill<Eigen::half>(k, n, 1), fill<Eigen::half>(kb, nb, 2), fill<Eigen::half>(v, n, 3);
  } else {
    fill<Eigen::bfloat16>(k, n, 1), fill<Eigen::bfloat16>(kb, nb, 2),
        fill<Eigen::bfloat16>(v, n, 3);
  }
  aligned_vector<float> q(static_cast<std::size_t>(hq * d)), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 13) / 13.0f - 0.5f;
  const aligned_vector<float> ceiling(std::size_t(64) << 20, 1.0f);  // 256 MiB
  const double kv_bytes = 2.0 * static_cast<double>(n) * (type == 0 ? 4 : 2);

  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  std::vector<double> mem, step[2], arith[2];
  volatile float sink = stream_sum(ceiling.data(), ceiling.size());
  // An untimed call of each first: the first pass over freshly written buffers can take
  // many times as long as the next ones on a virtual machine.
  step_a(type, threads, q.data(), k.data(), kb.data(), v.data(), out.data(), hkv, lk, true,
         layout_a);
  step_b(type, threads, q.data(), k.data(), kb.data(), v.data(), out.data(), hkv, lk, true,
         layout_b);
  for (int r = 0; r < rounds; ++r) {
    for (int w = 0; w < 2; ++w) {
      const int which = (w + r) % 2;  // who goes first alternates
      auto* f = which == 0 ? step_a : step_b;
      // The read before each streamed step also leaves none of the K/V in cache, as the
      // other layers of a model would: the second step of a round would otherwise find part
      // of the first one's K/V in the last-level cache.
      auto t0 = clock::now();
      sink = sink + stream_sum(ceiling.data(), ceiling.size());
      mem.push_back(kv_bytes / (static_cast<double>(ceiling.size()) * 4) * ms_since(t0));
      t0 = clock::now();
      f(type, threads, q.data(), k.data(), kb.data(), v.data(), out.data(), hkv, lk, true,
        layout_of[which]);
      step[which].push_back(ms_since(t0));
      t0 = clock::now();
      f(type, threads, q.data(), k.data(), kb.data(), v.data(), out.data(), hkv, lk, false,
        layout_of[which]);
      arith[which].push_back(ms_since(t0));
    }
  }
  std::printf(
      "memory %.2f ms  A step %.2f arith %.2f  B step %.2f arith %.2f  B/A step %.3f "
      "arith %.3f\n",
      median(mem), median(step[0]), median(arith[0]), median(step[1]), median(arith[1]),
      median(step[1]) / median(step[0]), median(arith[1]) / median(arith[0]));
  return 0;
}
