// SPDX-License-Identifier: MIT
// Ring and all-to-all attention over MPI (alibi::mpi::ring_attention, alltoall_attention): a
// fixed problem (batch 1, 16 heads,
// head_dim 64, causal, L = 16384 and 65536, far-tile skipping on) split over the ranks of
// mpirun, one eigen thread per rank. Run it with 1 and with 2 ranks and compare the times:
//
//   mpirun -np 1 build/bench/alibi_bench_mpi_ring
//   mpirun -np 2 build/bench/alibi_bench_mpi_ring
//
// Counters (rank 0's): bytes_sent (K/V bytes the rank sent), calls and masked (partial
// calls made and skipped by the masks), wait_s (time blocked in MPI_Waitall: communication
// that the computation did not hide) and hidden (1 - wait_s / time); summed over the ranks:
// all_bytes_sent, all_bytes_saved (not sent compared with a full ring), all_calls and
// all_skipped (pairs skipped by far-chunk skipping, arg far:1). Every rank runs the
// same fixed iterations (the ranks must call together); only rank 0 reports.
#include <mpi.h>
#include <sys/resource.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/mpi.hpp>

namespace {

using alibi::index_t;
int rank = 0, ranks = 1;
constexpr index_t B = 1, H = 16, D = 64;

/// The largest peak resident memory of the ranks, in MiB (the process's whole life: run one
/// benchmark per process, --benchmark_filter, for a benchmark's own peak).
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  long mine = u.ru_maxrss, most = 0;  // KiB on Linux
  MPI_Allreduce(&mine, &most, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  return static_cast<double>(most) / 1024.0;
}

/// This rank's n rows of q, k, v (random, seeded by the rank) and room for out, each
/// (B, H, n, D).
struct rank_part {
  std::vector<float> t[4];
  explicit rank_part(index_t n) {
    std::mt19937 rng(static_cast<unsigned>(rank + 1));
    std::normal_distribution<float> randn;
    for (auto& x : t) x.resize(static_cast<std::size_t>(B * H * n * D));
    for (int i = 0; i < 3; ++i)
      for (float& x : t[i]) x = randn(rng);
  }
};

// Args: total length, layout (0 contiguous, 1 zigzag), far-chunk skipping (0 off, 1 on).
void BM_ring(benchmark::State& state) {
  const index_t L = state.range(0), n = L / ranks;
  const auto layout =
      state.range(1) ? alibi::mpi::ring_layout::zigzag : alibi::mpi::ring_layout::contiguous;
  if (layout == alibi::mpi::ring_layout::zigzag && L % (2 * ranks) != 0) {
    state.SkipWithError("zigzag needs 2 * ranks equal chunks");
    return;
  }
  rank_part x(n);
  auto& [q, k, v, out] = x.t;
  alibi::attention_params params;
  params.mask.causal = true;
  alibi::mpi::ring_options opt;
  opt.layout = layout;
  opt.skip_far_chunks = state.range(2) != 0;
  alibi::mpi::ring_stats stats;
  double seconds = 0;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    alibi::mpi::ring_attention(MPI_COMM_WORLD, alibi::backend::eigen{1},
                               alibi::make_view<const float>(q.data(), B, H, n, D),
                               alibi::make_view<const float>(k.data(), B, H, n, D),
                               alibi::make_view<const float>(v.data(), B, H, n, D),
                               alibi::make_view(out.data(), B, H, n, D), params, opt, &stats);
    MPI_Barrier(MPI_COMM_WORLD);  // the time of the slowest rank
    const double t = MPI_Wtime() - t0;
    seconds += t;
    state.SetIterationTime(t);
  }
  const double it = static_cast<double>(state.iterations());
  // Every rank's bytes and pairs, summed.
  long long mine[4] = {stats.bytes_sent, stats.bytes_saved, stats.chunk_calls,
                       stats.chunks_skipped},
            all[4] = {};
  MPI_Allreduce(mine, all, 4, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  state.counters["ranks"] = ranks;
  state.counters["bytes_sent"] = static_cast<double>(stats.bytes_sent) / it;
  state.counters["all_bytes_sent"] = static_cast<double>(all[0]) / it;
  state.counters["all_bytes_saved"] = static_cast<double>(all[1]) / it;
  state.counters["all_calls"] = static_cast<double>(all[2]) / it;
  state.counters["all_skipped"] = static_cast<double>(all[3]) / it;
  state.counters["calls"] = static_cast<double>(stats.chunk_calls) / it;
  state.counters["masked"] = static_cast<double>(stats.chunks_masked) / it;
  state.counters["wait_s"] = stats.wait_seconds / it;
  state.counters["hidden"] = 1.0 - stats.wait_seconds / seconds;
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

/// The cost model's inputs (docs/mpi.md), with 1 rank: one attention() call over
/// the whole problem, far-tile skipping off (the rate per computed score) and on (how far
/// ALiBi reaches: the tiles computed), one thread (mpirun binds a rank to one core). Args: L,
/// skip.
void BM_single(benchmark::State& state) {
  if (ranks != 1) {
    state.SkipWithError("the calibration runs with 1 rank");
    return;
  }
  const index_t L = state.range(0);
  rank_part x(L);
  auto& [q, k, v, out] = x.t;
  alibi::attention_params params;
  params.mask.causal = true;
  params.skip_far_tiles = state.range(1) != 0;
  alibi::attention_stats stats;
  params.stats = &stats;
  const alibi::backend::eigen be{1};
  for (auto _ : state) {
    const double t0 = MPI_Wtime();
    alibi::attention(be, alibi::make_view<const float>(q.data(), B, H, L, D),
                     alibi::make_view<const float>(k.data(), B, H, L, D),
                     alibi::make_view<const float>(v.data(), B, H, L, D),
                     alibi::make_view(out.data(), B, H, L, D), params);
    state.SetIterationTime(MPI_Wtime() - t0);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["tiles_computed"] = static_cast<double>(stats.tiles_computed) / it;
  state.counters["tiles_skipped"] = static_cast<double>(stats.tiles_skipped) / it;
}

/// Loopback bandwidth between ranks 0 and 1 (the cost model's network here): a message of
/// `bytes` there and back.
void BM_pingpong(benchmark::State& state) {
  if (ranks < 2) {
    state.SkipWithError("the ping-pong needs 2 ranks");
    return;
  }
  std::vector<char> buf(static_cast<std::size_t>(state.range(0)));
  const int count = static_cast<int>(buf.size());
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf.data(), count, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), count, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf.data(), count, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), count, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    state.SetIterationTime(MPI_Wtime() - t0);
  }
  state.SetBytesProcessed(2 * state.range(0) * static_cast<std::int64_t>(state.iterations()));
  state.counters["peak_rss_MiB"] = peak_rss_mib();  // with 8 bytes: the processes' baseline
}

BENCHMARK(BM_single)
    ->ArgsProduct({{4096, 16384}, {0, 1}})
    ->ArgNames({"L", "skip"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(3);

BENCHMARK(BM_pingpong)
    ->Arg(8)
    ->Arg(64 << 20)
    ->ArgNames({"bytes"})
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(20)
    ->Repetitions(3);

/// All-to-all (Ulysses) attention on the same problem (16 heads: 1, 2, 4, 8 or 16 ranks).
void BM_alltoall(benchmark::State& state) {
  const index_t L = state.range(0), n = L / ranks;
  rank_part x(n);
  auto& [q, k, v, out] = x.t;
  alibi::attention_params params;
  params.mask.causal = true;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    alibi::mpi::alltoall_attention(MPI_COMM_WORLD, alibi::backend::eigen{1},
                                   alibi::make_view<const float>(q.data(), B, H, n, D),
                                   alibi::make_view<const float>(k.data(), B, H, n, D),
                                   alibi::make_view<const float>(v.data(), B, H, n, D),
                                   alibi::make_view(out.data(), B, H, n, D), params);
    MPI_Barrier(MPI_COMM_WORLD);
    state.SetIterationTime(MPI_Wtime() - t0);
  }
  state.counters["ranks"] = ranks;
  // q, k, v out and out back: (P - 1) / P of each.
  state.counters["bytes_sent"] = 4.0 * B * H * n * D * sizeof(float) * (ranks - 1) / ranks;
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

BENCHMARK(BM_alltoall)
    ->Arg(16384)
    ->Arg(65536)
    ->ArgNames({"L"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(3);

BENCHMARK(BM_ring)
    ->ArgsProduct({{16384, 65536}, {0, 1}, {0, 1}})
    ->ArgNames({"L", "zigzag", "far"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1)
    ->Repetitions(3);

/// Swallows the output of the ranks other than 0.
class quiet_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  // Only rank 0 writes --benchmark_out (the ranks would write one file at once).
  if (rank != 0)
    argc = static_cast<int>(
        std::remove_if(argv + 1, argv + argc,
                       [](const char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }) -
        argv);
  benchmark::Initialize(&argc, argv);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    quiet_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
