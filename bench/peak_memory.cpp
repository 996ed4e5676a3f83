// SPDX-License-Identifier: MIT
// Peak resident memory of a long causal attention, H = 16, D = 64, fused CPU backend, 2
// threads: `alibi_peak_memory [L] [forward|backward]` (L default 32768 for the forward,
// 16384 for the backward). Prints the tensors' own size, the peak RSS, the memory beyond the
// tensors, and the time. The backward's tensors are q, k, v, out, dout, dq, dk, dv (and the
// logsumexp); the forward runs first to produce out and the logsumexp.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.hpp"

namespace {

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool backward = argc > 2 && std::strcmp(argv[2], "backward") == 0;
  const alibi::index_t len = argc > 1 ? std::atol(argv[1]) : backward ? 16384 : 32768;
  constexpr alibi::index_t H = 16, D = 64;
  alibi_bench::inputs in(H, len, len, D);
  alibi::attention_params p;
  p.mask.causal = true;
  std::vector<float> lse;
  if (backward) {
    lse.resize(static_cast<std::size_t>(H * len));
    p.logsumexp = alibi::make_view(lse.data(), 1, H, len);
  }
  auto t0 = std::chrono::steady_clock::now();
  alibi::attention(alibi::backend::eigen{2}, in.qv(), in.kv(), in.vv(), in.ov(), p);
  double s = seconds_since(t0);
  double tensors_mib = 4.0 * static_cast<double>(in.q.size()) * 4 / (1 << 20);
  if (backward) {
    // dout, dq, dk, dv: touched (written) before the call so they count as tensors.
    std::vector<float> dout(in.q.size(), 0.5f), dq(in.q.size(), 0.0f), dk(in.q.size(), 0.0f),
        dv(in.q.size(), 0.0f);
    const auto view = [&](std::vector<float>& x) {
      return alibi::make_view(x.data(), 1, H, len, D);
    };
    t0 = std::chrono::steady_clock::now();
    alibi::attention_backward(alibi::backend::eigen{2}, in.qv(), in.kv(), in.vv(), view(in.out),
                              view(dout), p,
                              alibi::attention_gradients<float>{view(dq), view(dk), view(dv)});
    s = seconds_since(t0);
    tensors_mib = 8.0 * static_cast<double>(in.q.size()) * 4 / (1 << 20) +
                  static_cast<double>(lse.size()) * 4 / (1 << 20);
  }
  const double peak = peak_rss_mib();
  std::printf(
      "%s L=%lld H=16 D=64 causal, 2 threads: %.2f s, tensors %.0f MiB, peak RSS %.0f MiB, "
      "beyond the tensors %.0f MiB\n",
      backward ? "backward" : "forward", static_cast<long long>(len), s, tensors_mib, peak,
      peak - tensors_mib);
  // The budget: a fraction of the tensors for the forward; 256 MiB beyond the tensors for
  // the backward (issue target at L = 16384).
  return peak - tensors_mib < (backward ? 256.0 : 512.0) ? 0 : 1;
}
