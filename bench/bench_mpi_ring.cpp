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
// that the computation did not hide) and hidden (1 - wait_s / time). Every rank runs the
// same fixed iterations (the ranks must call together); only rank 0 reports.
#include <mpi.h>

#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include <alibi/alibi.hpp>
#include <alibi/mpi.hpp>

namespace {

using alibi::index_t;
int rank = 0, ranks = 1;
constexpr index_t B = 1, H = 16, D = 64;

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

// Args: total length, layout (0 contiguous, 1 zigzag).
void BM_ring(benchmark::State& state) {
  const index_t L = state.range(0), n = L / ranks;
  const auto layout =
      state.range(1) ? alibi::mpi::ring_layout::zigzag : alibi::mpi::ring_layout::contiguous;
  rank_part x(n);
  auto& [q, k, v, out] = x.t;
  alibi::attention_params params;
  params.mask.causal = true;
  alibi::mpi::ring_options opt;
  opt.layout = layout;
  alibi::mpi::ring_stats stats;
  double seconds = 0;
  for (auto _ : state) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    alibi::mpi::ring_attention(MPI_COMM_WORLD, alibi::backend::eigen{1},
                               alibi::make_view<const float>(q.data(), B, H, n, D),
                               alibi::make_view<const float>(k.data(), B, H, n, D),
                               alibi::make_view<const float>(v.data(), B, H, n, D),
                               alibi::make_view(out.data(), B, H, n, D), params, opt, {}, &stats);
    MPI_Barrier(MPI_COMM_WORLD);  // the time of the slowest rank
    const double t = MPI_Wtime() - t0;
    seconds += t;
    state.SetIterationTime(t);
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["ranks"] = ranks;
  state.counters["bytes_sent"] = static_cast<double>(stats.bytes_sent) / it;
  state.counters["calls"] = static_cast<double>(stats.chunk_calls) / it;
  state.counters["masked"] = static_cast<double>(stats.chunks_masked) / it;
  state.counters["wait_s"] = stats.wait_seconds / it;
  state.counters["hidden"] = 1.0 - stats.wait_seconds / seconds;
}

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
    ->ArgsProduct({{16384, 65536}, {0, 1}})
    ->ArgNames({"L", "zigzag"})
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
