// SPDX-License-Identifier: MIT
// Peak resident memory of a long causal attention: L = 32768, H = 16, D = 64 (fused CPU
// backend, 2 threads). Prints the inputs' own size, the peak RSS, and the time.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "common.hpp"

int main(int argc, char** argv) {
  const alibi::index_t len = argc > 1 ? std::atol(argv[1]) : 32768;
  alibi_bench::inputs in(16, len, len, 64);
  alibi::attention_params p;
  p.mask.causal = true;
  const auto t0 = std::chrono::steady_clock::now();
  alibi::attention(alibi::backend::eigen{2}, in.qv(), in.kv(), in.vv(), in.ov(), p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double tensors_mib = 4.0 * in.q.size() * 4 / (1 << 20);
  std::printf("L=%lld H=16 D=64 causal, 2 threads: %.2f s, q/k/v/out %.0f MiB, peak RSS %.0f MiB\n",
              static_cast<long long>(len), s, tensors_mib, ru.ru_maxrss / 1024.0);
  return ru.ru_maxrss / 1024.0 < 1024.0 ? 0 : 1;
}
