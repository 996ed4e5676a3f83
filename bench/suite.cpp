// SPDX-License-Identifier: MIT
// The seeds' experiment, extended: ALiBi attention with the seed's configuration (embed 512,
// 8 heads of 64, batch 1) for sequence lengths 128..16384 (doubling), causal and not, on
// every CPU path: the seed algorithm in fp32 (materialized scores + bias) and the fused
// backend (1 thread, and every hardware thread). Per case: time (Google Benchmark), GFLOP/s,
// and the peak extra memory of one call.
//
// Peak extra memory: the growth of the peak resident set during one call, measured in a
// fresh process (this executable re-run with --peak-extra), so that caches, workspaces, thread
// pools and allocator pools grown by earlier cases do not hide the call's own needs. That
// process allocates the inputs, resets its peak-RSS watermark (/proc/self/clear_refs, "5"),
// makes the call and reports VmHWM - VmRSS before the call. It counts every byte the call
// touches (score matrices, workspaces, thread stacks), whatever allocator produced it. The
// inputs and output are not counted (`tensors_MiB` gives their size).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "common.hpp"

namespace {

using alibi_bench::index_t;

constexpr index_t seed_heads = 8, seed_dim = 64;  // embed 512 = 8 heads x 64

/// A field of /proc/self/status in KiB, or -1.
long status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0) return std::atol(line.c_str() + n + 1);
  return -1;
}

enum class path { seed_fp32, fused };

alibi_bench::inputs make_inputs(index_t len) {
  return alibi_bench::inputs(seed_heads, len, len, seed_dim, 7);
}

void run_once(path which, alibi_bench::inputs& in, bool causal, int threads) {
  if (which == path::seed_fp32) {
    alibi_bench::seed_attention(threads, in, causal);
  } else {
    alibi::attention_params p;
    p.mask.causal = causal;
    alibi::attention(alibi::backend::eigen{threads}, in.qv(), in.kv(), in.vv(), in.ov(), p);
  }
}

/// The --peak-extra mode: one call in this fresh process; prints the peak extra MiB.
int measure_peak_extra(int argc, char** argv) {
  if (argc != 6) return 2;
  const path which = std::strcmp(argv[2], "seed") == 0 ? path::seed_fp32 : path::fused;
  alibi_bench::inputs in = make_inputs(std::atol(argv[3]));
  std::ofstream("/proc/self/clear_refs") << "5";  // peak RSS := current RSS
  const long before = status_kib("VmRSS:");
  run_once(which, in, std::atoi(argv[4]) != 0, std::atoi(argv[5]));
  const long peak = status_kib("VmHWM:");
  std::printf("%.3f\n", before < 0 || peak < 0 ? -1.0 : (peak - before) / 1024.0);
  return 0;
}

/// Runs the --peak-extra mode in a child process; negative when it could not be measured.
double peak_extra_mib(path which, index_t len, bool causal, int threads) {
  const std::string cmd = "/proc/" + std::to_string(getpid()) + "/exe --peak-extra " +
                          (which == path::seed_fp32 ? "seed" : "fused") + " " +
                          std::to_string(len) + " " + (causal ? "1" : "0") + " " +
                          std::to_string(threads);
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  double mib = -1;
  if (std::fscanf(f, "%lf", &mib) != 1) mib = -1;
  return pclose(f) == 0 ? mib : -1;
}

// Args: length, causal, threads (0: every hardware thread).
template <path P>
void BM_suite(benchmark::State& state) {
  const index_t len = state.range(0);
  const bool causal = state.range(1) != 0;
  const int threads = state.range(2) > 0 ? static_cast<int>(state.range(2))
                                         : static_cast<int>(std::thread::hardware_concurrency());
  alibi_bench::inputs in = make_inputs(len);
  const double extra = peak_extra_mib(P, len, causal, threads);
  alibi_bench::timed_steps(state, [&] {
    run_once(P, in, causal, threads);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  });
  state.counters["GFLOP/s"] =
      benchmark::Counter(alibi_bench::attention_flops(seed_heads, len, len, seed_dim, causal) / 1e9,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_extra_MiB"] = extra;
  state.counters["tensors_MiB"] =
      4.0 * static_cast<double>(in.q.size()) * sizeof(float) / (1 << 20);
  state.counters["cpu_threads"] = threads;
}

void suite_args(benchmark::internal::Benchmark* b, bool seed) {
  b->ArgNames({"L", "causal", "threads"});
  for (int causal : {1, 0})
    for (index_t len = 128; len <= 16384; len *= 2)
      for (int threads : {1, 0}) {
        // The seed algorithm's L x L buffers make the longest lengths slow; 8192 is enough to
        // show the trend (2 x 256 MiB per thread).
        if (seed && len > 8192) continue;
        b->Args({len, causal, threads});
      }
  b->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
}

}  // namespace

BENCHMARK_TEMPLATE(BM_suite, path::seed_fp32)
    ->Name("suite/seed_fp32")
    ->Apply([](benchmark::internal::Benchmark* b) { suite_args(b, true); });
BENCHMARK_TEMPLATE(BM_suite, path::fused)
    ->Name("suite/fused_cpu")
    ->Apply([](benchmark::internal::Benchmark* b) { suite_args(b, false); });

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--peak-extra") == 0) return measure_peak_extra(argc, argv);
  {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line))
      if (line.rfind("model name", 0) == 0) {
        benchmark::AddCustomContext("cpu", line.substr(line.find(':') + 2));
        break;
      }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
